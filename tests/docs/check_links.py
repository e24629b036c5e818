#!/usr/bin/env python3
"""Every relative link of the user's guide (README.md and docs/*.md) leads somewhere: the file
exists, and an #anchor names a heading of the page it points to (GitHub's anchors: lowercase,
punctuation dropped, spaces to '-'). Links to the web are not followed. The runnable marks are
parsed too, so a mark without its block fails here as well as in run_examples.py.

Usage: check_links.py [ROOT]   (default: the repository holding this script)
"""
import os
import sys
from urllib.parse import unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_pages import PageError, anchors, pages, read_page  # noqa: E402


def broken_links(root):
    problems, checked = [], 0
    headings_of = {}

    def page_anchors(path):
        if path not in headings_of:
            headings_of[path] = anchors(read_page(root, path)[1])
        return headings_of[path]

    for page in pages(root):
        _, _, links = read_page(root, page)
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
        problems, checked = broken_links(root)
    except PageError as e:
        print("FAILED: %s" % e)
        return 1
    for p in problems:
        print("FAILED %s" % p)
    print("%d relative links checked in %d pages: %d broken" % (checked, len(pages(root)), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
