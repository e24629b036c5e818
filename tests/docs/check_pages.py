#!/usr/bin/env python3
"""The user's guide (README.md and docs/*.md) holds together without running anything:
- every relative link leads somewhere: the file exists, and an #anchor names a heading of the page
  it points to (GitHub's anchors: lowercase, punctuation dropped, spaces to '-'); links to the web
  are not followed;
- every runnable mark parses and precedes a shell or python block (tests/docs/doc_pages.py);
- every path into the source tree a page names (`launch/cluster/netns.sh`, `tests/python/...`)
  exists (`name.*` stands for any extension);
- no command hides in a block without a language, where run_examples.py would not see it (write
  ```sh, and mark it runnable where it can run);
- no file of the project cites a document that is not in it: the interface's reference is
  docs/reference.md.

Usage: check_pages.py [ROOT]   (default: the repository holding this script)
"""
import glob
import os
import re
import sys
from urllib.parse import unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_pages import PageError, anchors, pages, read_page  # noqa: E402


SOURCE_PATH = re.compile(r"(?<![\w./-])((?:launch|tests|python|runtime|kernels|comm|util|include|emulation|cmake|docs)"
                         r"/[A-Za-z0-9_./*-]*[A-Za-z0-9_/*])")


def missing_paths(root, page):
    """Paths into the source tree named anywhere in the page (prose, code, blocks) that do not exist."""
    with open(os.path.join(root, page), encoding="utf-8") as f:
        text = f.read()
    missing = []
    for number, line in enumerate(text.split("\n"), 1):
        for path in SOURCE_PATH.findall(line):
            if not glob.glob(os.path.join(root, path.rstrip("/"))):
                missing.append("%s:%d: %s: no such file or folder" % (page, number, path))
    return missing


# Documents outside the repository that files once cited (written in two parts, so that this file
# does not cite them itself).
OUTSIDE_DOCUMENTS = ("SPEC" + ".md",)
SOURCE_FOLDERS = ("CMakeLists.txt", "README.md", "pyproject.toml", "cmake", "comm", "docs", "emulation", "include",
                  "kernels", "launch", "python", "runtime", "tests", "util")


def project_files(root):
    """The paths of the project's own files (not build folders, venvs or .git)."""
    for top in SOURCE_FOLDERS:
        path = os.path.join(root, top)
        if os.path.isfile(path):
            yield path
        for folder, _, files in os.walk(path):
            for name in files:
                yield os.path.join(folder, name)


def outside_citations(root):
    """Lines of the project's files that cite a document the repository does not hold."""
    found = []
    for path in project_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except (UnicodeDecodeError, OSError):
            continue  # binary (fuzz corpora) or unreadable: nothing to cite
        for number, line in enumerate(lines, 1):
            found += ["%s:%d: cites %s, which is not in the repository (docs/reference.md is)"
                      % (os.path.relpath(path, root), number, d) for d in OUTSIDE_DOCUMENTS if d in line]
    return found


def problems_of(root):
    problems, checked = outside_citations(root), 0
    headings_of = {}

    def page_anchors(path):
        if path not in headings_of:
            headings_of[path] = anchors(read_page(root, path)[1])
        return headings_of[path]

    for page in pages(root):
        blocks, _, links = read_page(root, page)
        problems += missing_paths(root, page)
        for block in blocks:
            if block.looks_like_a_command():
                problems.append("%s: a command in a block with no language (write ```sh): %s"
                                % (block.where(), block.text.split("\n")[0]))
        for line, target in links:
            if "://" in target or target.startswith(("mailto:", "//")):
                continue
            checked += 1
            path, _, fragment = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), unquote(path))) if path else page
            where = "%s:%d: %s" % (page, line, target)
            if resolved.startswith(".."):
                problems.append("%s: outside the repository" % where)
            elif not os.path.exists(os.path.join(root, resolved)):
                problems.append("%s: no such file %s" % (where, resolved))
            elif fragment:
                if not resolved.endswith(".md"):
                    problems.append("%s: an anchor into a file that is not a page" % where)
                elif fragment not in page_anchors(resolved):
                    problems.append("%s: %s has no heading with anchor #%s" % (where, resolved, fragment))
    return problems, checked


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        problems, checked = problems_of(root)
    except PageError as e:
        print("FAILED: %s" % e)
        return 1
    for p in problems:
        print("FAILED %s" % p)
    print("%d pages, %d relative links: %d problems" % (len(pages(root)), checked, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
