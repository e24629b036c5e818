#!/usr/bin/env python3
"""Runs every example of the user's guide marked runnable (README.md and docs/*.md; the marks:
tests/docs/doc_pages.py and docs/testing.md), as a user types them after the README's setup.

Each page gets a fresh temporary directory that looks like the repository root: every top-level
entry of the source tree linked into it, and `build` linked to the build under test, so
`build/ringattn`, `python/examples/...` and `launch/...` mean what they mean in a checkout, while
whatever an example writes (o.npy, run.json) lands in the temporary directory. A page's blocks run
there in order, as a reader follows the page (a block may use the files an earlier one wrote). Each
runs in bash after `source launch/env.sh` (the README's setup: the Python module on PYTHONPATH),
with `set -e` (unless the mark expects another exit status) and bounded time. The runner lets
mpirun run as root and start more ranks than there are cores (OMPI_ALLOW_RUN_AS_ROOT*,
OMPI_MCA_rmaps_base_oversubscribe), so the examples keep the form a user on a laptop types.

Usage: run_examples.py --build BUILD_DIR [--source ROOT] [--only PAGE[:LINE]]... [--keep] [--verbose]
       run_examples.py --list
Exit 0 when every marked block ran as its mark says, 1 otherwise (each failure named by page,
line and command, with the end of its output).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_pages import PYTHON_LANGUAGES, SHELL_LANGUAGES, PageError, pages, read_page  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
from netns_test import why_no_namespaces  # noqa: E402  (the cluster in a box's own probe)

OUTPUT_TAIL = 4000  # characters of a failed block's output shown


def scratch_root(source, build):
    """A temporary directory standing in for the repository root (see the module's docstring)."""
    root = tempfile.mkdtemp(prefix="ringattn-docs-")
    for entry in os.listdir(source):
        if entry in (".git", "build"):
            continue
        os.symlink(os.path.join(source, entry), os.path.join(root, entry))
    os.symlink(build, os.path.join(root, "build"))
    return root


def script_for(block, root):
    """The bash script that runs one block (a python block: saved as a script in ROOT, which it runs)."""
    options = block.options
    prelude = ["source launch/env.sh"]
    if options.exit_code == 0:
        # Name the command that failed, in the page's line numbers: the block's first line, the
        # script's line len(prelude) + 1, is the page's line block.line + 1.
        trap = "trap 'echo \"[docs] exit $? at %s:$((LINENO + %d)): $BASH_COMMAND\" >&2' ERR"
        prelude += ["set -e", trap % (block.page, block.line - 3)]
    if block.language in SHELL_LANGUAGES:
        return "\n".join(prelude) + "\n" + block.command_text()
    script = os.path.join(root, "docs_example_%s_%d.py" % (block.page.replace("/", "_").replace(".", "_"), block.line))
    with open(script, "w") as f:
        f.write(block.command_text())
    launch = "mpirun -np %d " % options.np if options.np else ""
    return "\n".join(prelude) + "\n%s%s %s\n" % (launch, options.python, script)


def run_block(block, root, env):
    """Runs one block: (None or what went wrong, its output, seconds)."""
    options = block.options
    block_env = dict(env, **options.env)

    def clean_up():  # before (what a killed earlier run left) and after; its exit status is not the test's
        for command in options.cleanup:
            subprocess.run(["bash", "-c", "source launch/env.sh; " + command], cwd=root, env=block_env,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=600)

    clean_up()
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", script_for(block, root)], cwd=root, env=block_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=options.timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = None
    finally:
        clean_up()
    seconds = time.monotonic() - started
    if status is None:
        problem = "did not finish within %g s" % options.timeout
    elif status != options.exit_code:
        problem = "exited with %d, expected %d" % (status, options.exit_code)
    else:
        return None, output, seconds
    return "%s\n%s" % (problem, output[-OUTPUT_TAIL:]), output, seconds


def selected(block, only):
    return not only or any(o == block.page or o == block.where() for o in only)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", help="the build under test (its ringattn, python/)")
    parser.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    parser.add_argument("--only", action="append", default=[], help="PAGE or PAGE:LINE (the fence's line)")
    parser.add_argument("--list", action="store_true", help="list the blocks, marked and not, and run nothing")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    parser.add_argument("--verbose", action="store_true", help="show every block's output")
    args = parser.parse_args()
    source = os.path.abspath(args.source)

    try:
        blocks = [b for page in pages(source) for b in read_page(source, page)[0]]
    except PageError as e:
        print("FAILED: %s" % e)
        return 1
    runnable_languages = SHELL_LANGUAGES | PYTHON_LANGUAGES
    if args.list:
        for b in blocks:
            if b.language in runnable_languages:
                print("%-24s %-7s %s" % (b.where(), b.language, "runnable" if b.runnable else "not marked"))
        return 0
    if not args.build:
        parser.error("--build is required to run the examples")
    build = os.path.abspath(args.build)

    # python3 is the Python running this script (ctest's: the system's, with NumPy, PyTorch and
    # mpi4py), as the pages assume.
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    env = dict(os.environ, PATH=path, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    no_netns = why_no_namespaces()
    ran, skipped, failures = 0, [], []
    started = time.monotonic()
    roots = {}
    try:
        for block in blocks:
            if not block.runnable or not selected(block, args.only):
                continue
            if "root" in block.options.needs and no_netns:
                skipped.append(block)
                print("skipped %s (needs network namespaces: %s)" % (block.where(), no_netns), flush=True)
                continue
            if block.page not in roots:
                roots[block.page] = scratch_root(source, build)
            problem, output, seconds = run_block(block, roots[block.page], env)
            ran += 1
            if problem:
                failures.append(block)
                print("FAILED %s (%.1f s): %s\n  the block as run:\n    %s\n" % (
                    block.where(), seconds, problem.replace("\n", "\n  "),
                    block.command_text().strip().replace("\n", "\n    ")), flush=True)
            else:
                print("ok     %s (%.1f s)" % (block.where(), seconds), flush=True)
                if args.verbose:
                    print("  " + output[-OUTPUT_TAIL:].strip().replace("\n", "\n  "), flush=True)
    finally:
        for page, root in roots.items():
            if args.keep:
                print("kept %s's directory: %s" % (page, root))
            else:
                shutil.rmtree(root, ignore_errors=True)
    unmarked = sum(1 for b in blocks if b.language in runnable_languages and not b.runnable)
    print("%d marked blocks ran in %.0f s: %d failed; %d skipped; %d shell/python blocks not marked (--list)"
          % (ran, time.monotonic() - started, len(failures), len(skipped), unmarked))
    if ran == 0 and not args.only:
        print("FAILED: no marked block ran")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
