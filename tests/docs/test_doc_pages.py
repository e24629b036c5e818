#!/usr/bin/env python3
"""The marks and links of tests/docs/doc_pages.py on small made-up pages: what a writer's mistake
looks like to the docs tests (a mark with no block, before a C++ block, a stale replacement, a link
to a missing heading), and GitHub's anchor rules."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_pages import problems_of  # noqa: E402
from doc_pages import PageError, anchor, anchors, read_page  # noqa: E402


class Pages(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        os.mkdir(os.path.join(self.root, "docs"))
        self.write("README.md", "# t\n")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, page, text):
        with open(os.path.join(self.root, page), "w") as f:
            f.write(text)

    def blocks(self, text):
        self.write("docs/p.md", text)
        return read_page(self.root, "docs/p.md")[0]

    def refused(self, text, words):
        with self.assertRaises(PageError) as e:
            self.blocks(text)
        self.assertIn(words, str(e.exception))
        return str(e.exception)

    def test_marked_and_unmarked_blocks(self):
        blocks = self.blocks("a\n\n<!-- runnable -->\n```sh\necho hi\n```\n\n```bash\nls\n```\n"
                             "<!-- runnable: np 2 python build/hfenv/bin/python -->\n```python\nprint(1)\n```\n")
        self.assertEqual([(b.line, b.language, b.runnable) for b in blocks],
                         [(4, "sh", True), (8, "bash", False), (12, "python", True)])
        self.assertEqual(blocks[0].text, "echo hi\n")
        self.assertEqual((blocks[2].options.np, blocks[2].options.python), (2, "build/hfenv/bin/python"))

    def test_options(self):
        (b,) = self.blocks('<!-- runnable: exit 2 timeout 9 env A=b replace "--seq-len 1048576" "--seq-len 64" '
                           'needs root cleanup "x down" -->\n```sh\nrun --seq-len 1048576\n```\n')
        o = b.options
        self.assertEqual((o.exit_code, o.timeout, o.env, o.needs, o.cleanup), (2, 9.0, {"A": "b"}, ["root"], ["x down"]))
        self.assertEqual(b.command_text(), "run --seq-len 64\n")

    def test_a_mark_with_no_block(self):
        self.refused("<!-- runnable -->\n", "no block after it")
        self.refused("<!-- runnable -->\ntext\n```sh\nls\n```\n", "no block after it")
        self.refused("<!-- runnable -->\n<!-- runnable -->\n```sh\nls\n```\n", "no block after it")

    def test_a_mark_before_a_block_that_is_not_shell(self):
        self.refused("<!-- runnable -->\n```cpp\nint x;\n```\n", "not sh, bash or python ('cpp')")
        self.refused("<!-- runnable -->\n```\noutput\n```\n", "no language")

    def test_bad_options(self):
        self.refused("<!-- runnable: exit -->\n```sh\nls\n```\n", "needs 1 value")
        self.refused("<!-- runnable: exit two -->\n```sh\nls\n```\n", "'exit'")
        self.refused("<!-- runnable: fast -->\n```sh\nls\n```\n", "unknown mark option 'fast'")
        self.refused("<!-- runnable: needs gpu -->\n```sh\nls\n```\n", "needs gpu")
        self.refused("<!-- runnable: np 2 -->\n```sh\nls\n```\n", "for python blocks")
        self.refused("<!-- runnable: replace 8192 64 -->\n```sh\nls\n```\n", "does not contain it")
        self.refused("<!--runnable:exit 2-- >\n```sh\nls\n```\n", "malformed")

    def test_a_mark_inside_a_block_is_text(self):
        (b,) = self.blocks("````md\n<!-- runnable -->\n```sh\nls\n```\n````\n")
        self.assertFalse(b.runnable)

    def test_github_anchors(self):
        self.assertEqual(anchor("The main job: `ringattn [attention]`"), "the-main-job-ringattn-attention")
        self.assertEqual(anchor("Hybrid parallelism: `--ulysses U`"), "hybrid-parallelism---ulysses-u")
        self.assertEqual(anchor("With Hugging Face models"), "with-hugging-face-models")
        self.assertEqual(anchor("Plan before renting: [the planner](x.md)"), "plan-before-renting-the-planner")
        self.assertEqual(anchors(["A", "A", "b_c"]), {"a", "a-1", "b_c"})

    def test_links(self):
        self.write("docs/p.md", "# Top\n## Two words\n[ok](../README.md) [ok](#two-words) [ok](p.md#top)\n"
                   "[web](https://example.com) `[code](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n"
                   "[bad](missing.md) [bad](#three) [bad](../README.md#nope)\n")
        problems, checked = problems_of(self.root)
        self.assertEqual(checked, 6)
        self.assertEqual(len(problems), 3, problems)
        self.assertIn("no such file docs/missing.md", problems[0])
        self.assertIn("no heading with anchor #three", problems[1])
        self.assertIn("README.md has no heading with anchor #nope", problems[2])

    def test_paths_into_the_source_tree(self):
        os.makedirs(os.path.join(self.root, "launch", "cluster"))
        self.write("launch/cluster/netns.sh", "")
        self.write("docs/p.md", "`launch/cluster/netns.sh` and launch/cluster/netns.* exist,\n"
                   "```sh\nlaunch/cluster/gone.sh up 4\n```\nbut not launch/gone/.\n")
        problems, _ = problems_of(self.root)
        self.assertEqual(problems, ["docs/p.md:3: launch/cluster/gone.sh: no such file or folder",
                                    "docs/p.md:5: launch/gone/: no such file or folder"])

    def test_a_command_in_a_block_with_no_language(self):
        self.write("docs/p.md", "```\nmpirun -np 2 build/ringattn\n```\n```\nringattn  2 ranks (output)\n```\n")
        problems, _ = problems_of(self.root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("docs/p.md:1: a command in a block with no language", problems[0])


if __name__ == "__main__":
    unittest.main()
