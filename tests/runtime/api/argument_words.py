"""The same bad inputs through the three interfaces: the command line, the C++ API and Python.
Each must name the argument in its own words (a flag; a C++ field; a Python keyword or tensor
shape), and none may name another interface's (issue 25: errors in the library's words).

  python3 argument_words.py BUILD_DIR
"""
import os
import subprocess
import sys

BUILD = sys.argv[1]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")

# name: (command-line flags, Python call's keywords and shapes, and the words each interface uses)
#   cli/cpp/py: substrings that must appear; foreign: substrings that must not.
CASES = {
    "kv-heads": dict(cli=["--heads", "8", "--kv-heads", "3", "--head-dim", "64", "--seq-len", "64"],
                     py=dict(heads=8, kv_heads=3),
                     words={"cli": ["--kv-heads 3", "--heads 8"], "cpp": ["kv_heads 3", "heads 8"],
                            "py": ["k.shape[2] 3", "q.shape[2] 8"]}),
    "window": dict(cli=["--window=-2,5", "--head-dim", "64", "--seq-len", "64"], py=dict(window=(-2, 5)),
                   words={"cli": ["--window (-2, 5)"], "cpp": ["window (-2, 5)"], "py": ["window (-2, 5)"]}),
    "scale": dict(cli=["--scale=-1", "--head-dim", "64", "--seq-len", "64"], py=dict(softmax_scale=-1.0),
                  words={"cli": ["--scale -1 must"], "cpp": ["softmax_scale -1 must"], "py": ["softmax_scale -1 must"]}),
    "head-dim": dict(cli=["--head-dim", "600", "--seq-len", "64"], py=dict(head_dim=600),
                     words={"cli": ["--head-dim 600"], "cpp": ["head_dim 600"], "py": ["q.shape[3] 600"]}),
    "doc-lens": dict(cli=["--doc-lens", "40,23", "--head-dim", "64", "--seq-len", "64"], py=dict(doc_lens=[40, 23]),
                     words={"cli": ["--doc-lens sum to 63"], "cpp": ["doc_lens sum to 63"],
                            "py": ["doc_lens sum to 63"]}),
    "ulysses": dict(cli=["--ulysses", "2", "--head-dim", "64", "--seq-len", "64"], py=dict(ulysses=2),
                    words={"cli": ["--ulysses 2"], "cpp": ["ulysses 2"], "py": ["ulysses 2"]}),
}
# What each interface calls its arguments, which the others must never show.
FLAG_WORDS = ["--kv-heads", "--heads", "--window", "--scale", "--head-dim", "--doc-lens", "--ulysses"]
CPP_WORDS = ["kv_heads", "head_dim"]  # (window, softmax_scale, doc_lens, ulysses are Python's keywords too)
PY_WORDS = ["q.shape", "k.shape"]
FOREIGN = {"cli": CPP_WORDS + PY_WORDS, "cpp": FLAG_WORDS + PY_WORDS, "py": FLAG_WORDS + CPP_WORDS}


def cli_message(args):
    p = subprocess.run([os.path.join(BUILD, "ringattn")] + args, env=ENV, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 2, "exit %d (expected 2): %s" % (p.returncode, p.stderr)
    return p.stderr.strip()


def cpp_message(name):
    p = subprocess.run([os.path.join(BUILD, "ringattn_api_errors"), name], env=ENV, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, "exit %d: %s %s" % (p.returncode, p.stdout, p.stderr)
    return p.stdout.strip()


def py_message(kw):
    sys.path.insert(0, os.path.join(BUILD, "python"))
    import torch
    import ringattn
    heads, kv_heads, head_dim = kw.pop("heads", 8), kw.pop("kv_heads", 8), kw.pop("head_dim", 64)
    q = torch.zeros(1, 64, heads, head_dim)
    k = torch.zeros(1, 64, kv_heads, head_dim)
    try:
        ringattn.attention(q, k, k.clone(), **kw)
    except (ValueError, TypeError) as e:
        return str(e)
    return "no error"


failures = []
for name, case in CASES.items():
    got = {"cli": cli_message(case["cli"]), "cpp": cpp_message(name), "py": py_message(dict(case["py"]))}
    for interface, message in got.items():
        for word in case["words"][interface]:
            if word not in message:
                failures.append("%s via %s: %r lacks %r" % (name, interface, message, word))
        for word in FOREIGN[interface]:
            if word in message:
                failures.append("%s via %s: %r names %r, another interface's word" % (name, interface, message, word))
    print("%-9s cli: %s\n%-9s cpp: %s\n%-9s py:  %s" % (name, got["cli"], "", got["cpp"], "", got["py"]))
if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("OK: every interface names the arguments in its own words")
