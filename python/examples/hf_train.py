"""A Hugging Face Llama trained with its attention on ringattn: every rank holds its own rows of
each sequence, the model's attention sees the whole sequence through the ring, and the gradients
are summed over the ranks, so every rank takes the same optimizer step.

  mpirun -np 2 python python/examples/hf_train.py                   # a tiny random Llama (no download)
  mpirun -np 2 python python/examples/hf_train.py --model NAME_OR_DIR  # a pretrained one
"""
import argparse

import torch
import transformers

import ringattn
import ringattn.hf  # registers attn_implementation="ringattn"

parser = argparse.ArgumentParser()
parser.add_argument("--model", help="a model name or folder for AutoModelForCausalLM (default: a tiny random Llama)")
parser.add_argument("--seq-len", type=int, default=1024)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

torch.manual_seed(0)  # the same weights and batches on every rank
if args.model:
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="ringattn",
                                                              dtype=torch.float32)
else:
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="ringattn")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(args.steps):
    input_ids = torch.randint(0, model.config.vocab_size, (1, args.seq_len))  # the whole batch, on every rank
    batch = ringattn.hf.shard_batch(input_ids)  # this rank's rows, their positions, the shifted labels
    loss = model(**batch).loss                  # this rank's share of the batch's mean loss
    loss.backward()
    ringattn.hf.all_reduce_gradients(model)     # the whole batch's gradients, on every rank
    optimizer.step()
    optimizer.zero_grad()
    loss = ringattn.hf.reduce_loss(loss)        # the batch's mean loss, on every rank
    if ringattn.rank() == 0:
        print("step %d  loss %.4f  (%d ranks, %d rows each)" % (step, loss, ringattn.size(), batch["input_ids"].shape[1]))
