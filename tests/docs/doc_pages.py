"""The user's guide as data: the pages (README.md and docs/*.md), their fenced blocks, the marks that
make a block a runnable example, their headings as GitHub anchors them, and their links.

A runnable example is a fenced sh/bash (or python) block whose opening fence follows a mark line:

    <!-- runnable -->
    <!-- runnable: replace "--seq-len 1048576" "--seq-len 16384" timeout 900 -->

GitHub renders the comment as nothing. The options after "runnable:" are words as a shell splits
them (quotes group), each keyword followed by its values:

    exit N             the block ends with exit status N (it runs without `set -e`), not 0
    replace OLD NEW    run the block with every OLD replaced by NEW (a smaller size, a venv's
                       path); OLD must occur in the block, so a stale replacement fails
    timeout S          seconds after which the block counts as hung (default 600: a bound only a
                       hang reaches; no example is checked for speed)
    env NAME=VALUE     an extra environment variable
    needs root         run only as root with network namespaces (the cluster in a box); skipped,
                       and counted as skipped, elsewhere
    cleanup CMD        run CMD before the block (what a killed earlier run left) and after it,
                       whether it passed or not; CMD's own exit status is ignored
    np N               (python blocks) run the script under `mpirun -np N`
    python EXE         (python blocks) the interpreter, default python3

tests/docs/run_examples.py runs them; docs/testing.md documents the convention for writers.
"""
import os
import re
import shlex
from dataclasses import dataclass, field

SHELL_LANGUAGES = {"sh", "bash", "shell"}
PYTHON_LANGUAGES = {"python", "py", "python3"}
MARK = re.compile(r"^\s*<!--\s*runnable(?::(?P<options>.*?))?\s*-->\s*$")
MARK_LIKE = re.compile(r"<!--\s*runnable", re.IGNORECASE)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\((?P<image>[^)\s]+)\)")
# The first line of a block with no language that is a command, not output: it belongs in an sh fence.
COMMAND_START = re.compile(r"^(mpirun|srun|sbatch|build/|launch/|python3? |pip |cmake |source |\$ )")
HEADING = re.compile(r"^\s{0,3}(?P<level>#{1,6})\s+(?P<text>.*?)\s*#*\s*$")


class PageError(Exception):
    """A mark the pages cannot honour (no block after it, not a shell block, a bad option)."""


@dataclass
class Options:
    exit_code: int = 0
    replacements: list = field(default_factory=list)  # (old, new)
    timeout: float = 600.0
    env: dict = field(default_factory=dict)
    needs: list = field(default_factory=list)
    cleanup: list = field(default_factory=list)
    np: int = 0
    python: str = "python3"


@dataclass
class Block:
    page: str          # path relative to the repository root
    line: int          # line of the opening fence (1-based)
    language: str
    text: str
    mark_line: int = 0  # line of the mark, 0 when unmarked
    options: Options = None

    def looks_like_a_command(self):
        """A block with no language whose first line reads as a command (mark it sh)."""
        return not self.language and bool(COMMAND_START.match(self.text))

    @property
    def runnable(self):
        return self.mark_line > 0

    def where(self):
        return "%s:%d" % (self.page, self.line)

    def command_text(self):
        """The block as it runs: the text with the mark's replacements made."""
        text = self.text
        for old, new in self.options.replacements:
            text = text.replace(old, new)
        return text


def parse_options(words, where):
    options = Options()
    i = 0

    def take(n):
        nonlocal i
        values = words[i + 1:i + 1 + n]
        if len(values) < n:
            raise PageError("%s: mark option '%s' needs %d value(s)" % (where, words[i], n))
        i += 1 + n
        return values

    while i < len(words):
        key = words[i]
        try:
            if key == "exit":
                options.exit_code = int(take(1)[0])
            elif key == "replace":
                old, new = take(2)
                if not old:
                    raise PageError("%s: 'replace' with nothing to replace" % where)
                options.replacements.append((old, new))
            elif key == "timeout":
                options.timeout = float(take(1)[0])
            elif key == "env":
                name, eq, value = take(1)[0].partition("=")
                if not eq or not name:
                    raise PageError("%s: 'env' wants NAME=VALUE" % where)
                options.env[name] = value
            elif key == "needs":
                need = take(1)[0]
                if need != "root":
                    raise PageError("%s: 'needs %s': only 'needs root' is known" % (where, need))
                options.needs.append(need)
            elif key == "cleanup":
                options.cleanup.append(take(1)[0])
            elif key == "np":
                options.np = int(take(1)[0])
            elif key == "python":
                options.python = take(1)[0]
            else:
                raise PageError("%s: unknown mark option '%s'" % (where, key))
        except ValueError as e:
            raise PageError("%s: mark option '%s': %s" % (where, key, e))
    return options


def read_page(root, page):
    """Every fenced block of one page (marked or not), and its headings and links outside code.

    Raises PageError for a mark that is not followed by a fence, one before a fence that is not a
    shell or python block, and one whose options do not parse or do not fit the block."""
    with open(os.path.join(root, page), encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, headings, links = [], [], []
    pending_mark = None  # (line, options text)
    fence = None         # the open fence: (marker, indent, language, start line, mark)
    body = []
    for number, line in enumerate(lines, 1):
        if fence is not None:
            m = FENCE.match(line)
            marker, indent = fence[0], fence[1]
            if m and m.group("fence")[0] == marker[0] and len(m.group("fence")) >= len(marker) \
                    and not m.group("info").strip():
                blocks.append(_block(page, fence, body))
                fence, body = None, []
            else:
                body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            continue
        m = FENCE.match(line)
        if m:
            language = m.group("info").strip().split()[0].lower() if m.group("info").strip() else ""
            fence = (m.group("fence"), len(m.group("indent")), language, number, pending_mark)
            pending_mark = None
            continue
        mark = MARK.match(line)
        if mark:
            if pending_mark:
                raise PageError("%s:%d: a runnable mark with no block after it" % (page, pending_mark[0]))
            pending_mark = (number, mark.group("options") or "")
            continue
        if MARK_LIKE.search(line):
            raise PageError("%s:%d: malformed runnable mark (want '<!-- runnable -->' or "
                            "'<!-- runnable: OPTIONS -->' alone on its line): %s" % (page, number, line.strip()))
        if pending_mark and line.strip():
            raise PageError("%s:%d: a runnable mark with no block after it" % (page, pending_mark[0]))
        h = HEADING.match(line)
        if h:
            headings.append(h.group("text"))
        for l in LINK.finditer(_outside_inline_code(line)):
            links.append((number, l.group("target") or l.group("image")))
    if pending_mark:
        raise PageError("%s:%d: a runnable mark with no block after it" % (page, pending_mark[0]))
    if fence is not None:
        raise PageError("%s:%d: a fence that is never closed" % (page, fence[3]))
    return blocks, headings, links


def _block(page, fence, body):
    _, _, language, start, mark = fence
    block = Block(page=page, line=start, language=language, text="\n".join(body) + "\n")
    if mark is None:
        return block
    where = "%s:%d" % (page, mark[0])
    if language not in SHELL_LANGUAGES | PYTHON_LANGUAGES:
        raise PageError("%s: a runnable mark before a block that is not sh, bash or python ('%s')"
                        % (where, language or "no language"))
    try:
        words = shlex.split(mark[1])
    except ValueError as e:
        raise PageError("%s: mark options: %s" % (where, e))
    block.mark_line = mark[0]
    block.options = parse_options(words, where)
    if language in SHELL_LANGUAGES and (block.options.np or block.options.python != "python3"):
        raise PageError("%s: 'np' and 'python' are for python blocks" % where)
    for old, _ in block.options.replacements:
        if old not in block.text:
            raise PageError("%s: 'replace %s ...': the block does not contain it" % (where, shlex.quote(old)))
    return block


def _outside_inline_code(line):
    """The line with `inline code` blanked, so that a link written as code is not checked."""
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def anchor(heading):
    """GitHub's anchor of a heading: the text without markup, lowercased, punctuation dropped
    (letters, digits, '-', '_' and spaces stay), spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(headings):
    """Every anchor of a page, repeats numbered as GitHub numbers them (x, x-1, x-2, ...)."""
    seen, result = {}, set()
    for h in headings:
        a = anchor(h)
        if a in seen:
            seen[a] += 1
            result.add("%s-%d" % (a, seen[a]))
        else:
            seen[a] = 0
            result.add(a)
    return result


def pages(root):
    """README.md and docs/*.md, relative to the repository root."""
    docs = sorted(f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    return ["README.md"] + ["docs/" + f for f in docs]
