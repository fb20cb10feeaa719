"""A log's envelope, read off the file itself: its encoding, its line ends, and the text every line is wrapped in.

The engine lines inside a saved log are vLLM's; the envelope is whatever the user's tooling put around them: a
PowerShell redirect (UTF-16 with a BOM, CRLF), a Windows editor (Latin-1), a CI job's ISO stamp, a row pasted
from a log viewer's table (pipes, a stamp and a host before the line, a pipe after it), journald in any locale,
``docker compose`` / ``kubectl --prefix`` columns. None of them is listed here. The wrapper is *learnt*
(:func:`learn`): on the lines that hold a recognisable vLLM line shape (:data:`ANCHOR`: a ``(name pid=N)``
prefix, a logger prefix ``LEVEL MM-DD hh:mm:ss [file.py:N]``, ``Traceback (most recent call last):``, an
exception line), the text before the shape is reduced to its skeleton — words, runs of blanks, punctuation —
and the skeleton most of them share is the prefix; a separator most of them end in is the suffix. Both are then
taken off every line that carries them, and the reader sees vLLM's lines as vLLM wrote them.

:func:`open_log` is the stage: it hands :class:`~sparkserve.observe.reader.LogReader` either the file untouched
(plain UTF-8 with no wrapper: the common case, read in place as before) or the inner lines as UTF-8 bytes, with
each line's *source* (the names in its wrapper, where they differ between lines: two services of a compose
file) and the :class:`Envelope` it found, which ``logs analyze --json`` reports.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from typing import Any, BinaryIO

from sparkserve.observe.logline import strip_ansi

#: The head of a file that decides its encoding and envelope (a wrapper is the same on every line).
SNIFF = 256 << 10
#: Lines of the head the learner reads.
LEARN_LINES = 4000

#: Shapes vLLM (and Python under it) writes at the start of its own lines: where a wrapper ends.
ANCHOR = re.compile(
    r"\((?:[A-Za-z_][\w.\-]*(?: [A-Za-z_][\w\-]*)?)(?: rank=\d+)? pid=\d+(?:, ip=[^)\s]+)?\)"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[?[\w./\\-]+\.py:\d+\]"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s{2,}"
    r"|Traceback \(most recent call last\):"
    r"|\[rank\d+\]:\[[IWEF]\d{3,4} "
    r"|[\w.-]+:\d+:\d+ \[\d+\] "
    r"|(?<![\w.])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\w*: \S"
)
#: One token of a wrapper's skeleton: a word (letters, digits and the joiners inside names and stamps), a run of
#: blanks, or one other character.
_TOKEN = re.compile(r"[^\s\[\](){}|:;,<>\"'=]+|\s+|.")
_WORD = r"[^\s\[\](){}|:;,<>\"'=]+"
#: Blanks inside a wrapper and the end of a suffix: never a line end (the patterns also run over a whole text).
_BLANKS = r"[ \t]+"
_TAIL = r"[ \t\r]*$"
#: A suffix: one to three separator characters after blanks at the end of a line (a log table's closing pipe).
_SUFFIX = re.compile(r"((?:\s+[^\w\s.,;:)\]}%>'\"`!?*-]{1,3})+)\s*$")
#: Stamps and numbers in a wrapper: not names (a line's source is the names in its wrapper).
_NAME = re.compile(r"[^\W\d_]{2,}[\w.\-/]*|[\w.\-/]*[^\W\d_]{2,}")
_MONTHS = re.compile(r"^[^\W\d_]{3,4}\.?$")


@dataclass(frozen=True)
class Envelope:
    """What was around a log's vLLM lines (``logs analyze --json``: ``envelopes``)."""

    encoding: str  # the codec the bytes were read with: utf-8, utf-8-sig, utf-16-le, utf-16-be, latin-1, …
    bom: bool
    line_ends: str  # lf | crlf | cr | mixed | none
    prefix: str | None = None  # the learnt wrapper before each line: its shape (``<w>`` a word, a blank a run)
    suffix: str | None = None  # …and after it
    example: str | None = None  # one line's wrapper as written
    lines: int = 0  # lines it was taken off

    def to_json(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "bom": self.bom, "line_ends": self.line_ends, "prefix": self.prefix,
                "suffix": self.suffix, "example": self.example, "lines": self.lines}

    @property
    def plain(self) -> bool:
        """UTF-8 (no BOM) with nothing to take off: the reader reads the file as it is."""
        return self.encoding == "utf-8" and not self.bom and self.prefix is None and self.suffix is None


@dataclass(frozen=True)
class Unwrapped:
    """The stage's output: what the reader reads, each line's source (or None), and the envelope."""

    data: bytes | BinaryIO
    sources: list[str | None] | None
    envelope: Envelope


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def detect_encoding(head: bytes, *, whole: bool) -> tuple[str, bool]:
    """(codec, has a BOM) by the BOM, else by the shape of the bytes: NULs on every other byte are UTF-16 (which
    half says the byte order), bytes that are not UTF-8 are Latin-1. ``whole``: ``head`` is the whole file (else
    a character cut at its end is no evidence)."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name, True
    sample = head[:8192]
    if len(sample) >= 4:
        even, odd = sample[0::2], sample[1::2]
        z_even, z_odd = even.count(0) / len(even), odd.count(0) / max(len(odd), 1)
        if z_odd > 0.3 and z_even < 0.05:
            return "utf-16-le", False
        if z_even > 0.3 and z_odd < 0.05:
            return "utf-16-be", False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if not whole and e.start >= len(head) - 3 and e.reason == "unexpected end of data":
            return "utf-8", False  # a character cut by the sniff's end
        text = head.decode("utf-8", "replace")
        bad = text.count("\ufffd")
        good = sum(1 for c in text if c > "\x7f") - bad
        if good <= bad:  # no more UTF-8 than broken bytes: written in Latin-1 (a few broken bytes in UTF-8 are not)
            return "latin-1", False
    return "utf-8", False


def line_ends(text: str) -> str:
    crlf = text.count("\r\n")
    lf = text.count("\n") - crlf
    if crlf and lf:
        return "mixed"
    if crlf:
        return "crlf"
    if lf:
        return "lf"
    return "cr" if text.count("\r") > 1 else "none"


def _learn_suffix(inner: list[str]) -> re.Pattern[str] | None:
    """The separators after blanks that three lines in five end in (a log table's closing pipe; two when a row of
    one table was pasted into another)."""
    ends = Counter(tuple(m.group(1).split()) for m in map(_SUFFIX.search, inner) if m)
    if ends:
        seps, n = ends.most_common(1)[0]
        if n * 5 >= len(inner) * 3 and "\ufffd" not in "".join(seps):
            return re.compile("".join(_BLANKS + re.escape(sep) for sep in seps) + _TAIL, re.M)
    return None


def _kind(t: str) -> str:
    return "S" if t.isspace() else ("W" if len(t) > 1 or re.fullmatch(_WORD, t) else t)


def _skeleton(prefix: str) -> tuple[str, ...]:
    """The shape of a wrapper: ``W`` a word, ``S`` blanks, any other character as itself."""
    out = []
    for t in _TOKEN.findall(prefix):
        out.append("S" if t.isspace() else ("W" if len(t) > 1 or re.fullmatch(_WORD, t) else t))
    return tuple(out)


def _regex(skel: tuple[str, ...], tail_blank: str, lead_blank: bool) -> str:
    """The regex of a skeleton: words and inner blanks of any length, the last blank exactly as learnt (it may be
    followed by a traceback frame's own indentation, which is vLLM's)."""
    parts = []
    for i, t in enumerate(skel):
        if t == "W":
            parts.append(_WORD)
        elif t == "S":
            if i == len(skel) - 1:
                parts.append(re.escape(tail_blank))
            elif i == 0 and lead_blank:
                parts.append(r"[ \t]*")
            else:
                parts.append(_BLANKS)
        else:
            parts.append(re.escape(t))
    return "".join(parts)


@dataclass(frozen=True)
class Learnt:
    prefix: re.Pattern[str] | None
    suffix: re.Pattern[str] | None
    example: str | None
    names: bool  # the wrappers' names differ between lines: they say which writer a line is
    shape: str | None = None  # the prefix's skeleton, readable


def learn(lines: list[str]) -> Learnt:
    """The wrapper the lines share (module docstring): a prefix when at least half the lines that hold a vLLM
    shape have the same non-empty skeleton before it, a suffix when most prefixed lines end in the same
    separator."""
    anchored: list[tuple[str, int]] = []
    for raw in lines[:LEARN_LINES]:
        s = strip_ansi(raw).rstrip("\r")
        m = ANCHOR.search(s)
        if m is not None:
            anchored.append((s, m.start()))
    if not anchored:
        got = _learn_unanchored(lines)
        rows = [strip_ansi(x).rstrip("\r") for x in lines[:LEARN_LINES] if x.strip()]
        pre = got.prefix
        inner = [x[pre.match(x).end():] if pre and pre.match(x) else x for x in rows]  # type: ignore[union-attr]
        suf = _learn_suffix(inner) if pre is not None else None
        return Learnt(pre, suf, got.example, got.names, got.shape)
    skels = Counter(_skeleton(s[:at]) for s, at in anchored if s[:at].strip())
    prefix_re = None
    example = None
    prefix_shape = None
    if skels:
        skel, n = skels.most_common(1)[0]
        if not _wrapper_like(skel, [s[:at] for s, at in anchored if _skeleton(s[:at]) == skel]):
            n = 0
        if n * 2 >= len(anchored) and n >= 1:
            ex = [s[:at] for s, at in anchored if s[:at].strip() and _skeleton(s[:at]) == skel]
            tails = Counter(_TOKEN.findall(p)[-1] for p in ex if _TOKEN.findall(p)[-1].isspace())
            tail = tails.most_common(1)[0][0] if tails else ""
            prefix_re = re.compile(_regex(skel, tail, skel[0] == "S"))
            example = ex[0]
            prefix_shape = shape(skel, tail)
    inner = [s[prefix_re.match(s).end():] if prefix_re and prefix_re.match(s) else s for s, _ in anchored]
    suffix_re = _learn_suffix(inner)
    names = False
    if prefix_re is not None:
        seen = {_names(s[: prefix_re.match(s).end()]) for s, _ in anchored if prefix_re.match(s)}  # type: ignore[union-attr]
        names = len(seen) > 1
    return Learnt(prefix_re, suffix_re, example, names, prefix_shape)


#: A wrapper is a few columns, never a progress bar or a message.
MAX_WRAPPER = 120
_NOT_WRAPPER = re.compile(r"\d+%\||it/s\]|s/it\]")


def _wrapper_like(skel: tuple[str, ...], examples: list[str]) -> bool:
    return len(skel) <= 40 and all(len(e) <= MAX_WRAPPER and not _NOT_WRAPPER.search(e) for e in examples[:50])


def shape(skel: tuple[str, ...], tail: str) -> str:
    """A skeleton as people read it: ``<w>`` a word, one blank for a run of blanks (the last as learnt)."""
    return "".join("<w>" if t == "W" else (" " if t == "S" else t) for t in skel[:-1]) + (
        tail if skel and skel[-1] == "S" else ("<w>" if skel and skel[-1] == "W" else (skel[-1] if skel else "")))


#: Two words in a row: a message (`Capturing CUDA graphs`), never a constant wrapper without a stamp.
_PROSE = re.compile(r"[^\W\d_]{2,} [^\W\d_]{2,}")
#: Lines the unanchored learner needs, and the share of them a wrapper must be on.
MIN_UNANCHORED = 3


def _learn_unanchored(lines: list[str]) -> Learnt:
    """A wrapper on lines that hold no vLLM shape at all (bare V0 messages, NCCL-free extracts): the leading tokens
    most lines share in shape, as long as each is a stamp or number (a word with a digit), a name that is the
    same on nine lines in ten, a blank or punctuation; it ends at its last blank. A message's first word, which
    varies, ends it."""
    rows = [strip_ansi(x).rstrip("\r") for x in lines[:LEARN_LINES]]
    rows = [x for x in rows if x.strip()]
    if len(rows) < MIN_UNANCHORED:
        return Learnt(None, None, None, False, None)
    toks = [_TOKEN.findall(x[:MAX_WRAPPER + 1]) for x in rows]
    need = len(rows) * 9 // 10
    end = 0  # tokens of the wrapper, up to its last blank
    for k in range(40):
        col = [t[k] for t in toks if len(t) > k]
        if len(col) < need:
            break
        kinds = Counter(map(_kind, col))
        kind, n = kinds.most_common(1)[0]
        if n < need:
            break
        if kind == "W":
            words = [c for c in col if re.fullmatch(_WORD, c)]
            same = Counter(words).most_common(1)[0][1]
            if not (sum(any(ch.isdigit() for ch in w) for w in words) >= need or same >= need):
                break
        if kind == "S":
            end = k + 1
        toks = [t for t in toks if len(t) > k and _kind(t[k]) == kind]
    if end == 0:
        return Learnt(None, None, None, False, None)
    wrappers = ["".join(_TOKEN.findall(x)[:end]) for x in rows]
    skel = Counter(_skeleton(w) for w in wrappers).most_common(1)[0][0]
    ex = [w for w in wrappers if _skeleton(w) == skel]
    constant = Counter(w.rstrip() for w in ex).most_common(1)[0][1] >= need  # one text on 9 lines in 10: a pod
    stamped = any(ch.isdigit() for ch in ex[0])
    if len(ex) < need or not (stamped or (constant and not _PROSE.search(ex[0]))) or not _wrapper_like(skel, ex):
        return Learnt(None, None, None, False, None)
    tail = _TOKEN.findall(ex[0])[-1]
    prefix_re = re.compile(_regex(skel, tail, skel[0] == "S"))
    names = len({_names(w) for w in ex}) > 1
    return Learnt(prefix_re, None, ex[0], names, shape(skel, tail))


def _names(wrapper: str) -> str:
    """The names in a wrapper (hosts, services, pods, units), not its stamps or numbers or month names."""
    return " ".join(n for n in _NAME.findall(wrapper) if not _MONTHS.match(n))


def _head(log: bytes | BinaryIO) -> tuple[bytes, bool]:
    """The first :data:`SNIFF` bytes, and whether that is the whole log; a stream that cannot seek is read whole."""
    if isinstance(log, bytes):
        return log[:SNIFF], len(log) <= SNIFF
    try:
        fd = log.fileno()
        st = os.fstat(fd)
        regular = stat.S_ISREG(st.st_mode)
    except (OSError, ValueError):
        regular = False
    if not regular:
        return b"", False
    head = os.pread(fd, SNIFF, 0)
    return head, st.st_size <= SNIFF


def open_log(log: bytes | BinaryIO) -> Unwrapped:
    """The envelope stage (module docstring): the log as the reader should read it, and what was around it."""
    head, whole = _head(log)
    if not isinstance(log, bytes) and not head and not whole:
        data = log.read()  # a pipe or stdin: read whole, then sniffed like bytes
        return open_log(data)
    encoding, bom = detect_encoding(head, whole=whole)
    text_head = _decode(head, encoding, bom, final=whole)
    learnt = learn(text_head.split("\n"))
    ends = line_ends(text_head)
    if encoding == "utf-8" and learnt.prefix is None and learnt.suffix is None:
        return Unwrapped(log, None, Envelope(encoding, bom, ends))
    data = log if isinstance(log, bytes) else _read_all(log)
    text = _decode(data, encoding, bom, final=True)
    if not whole:
        ends = line_ends(text)
    return _rewrite(text, learnt, Envelope(encoding, bom, ends))


def _read_all(log: BinaryIO) -> bytes:
    fd = log.fileno()
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0)


def decode(data: bytes, encoding: str, bom: bool) -> str:
    """A whole log's bytes as text, in the encoding :func:`detect_encoding` found (undecodable bytes replaced)."""
    return _decode(data, encoding, bom, final=True)


def _decode(data: bytes, encoding: str, bom: bool, *, final: bool) -> str:
    if bom:
        data = data[len(next(b for b, n in _BOMS if n == encoding)):]
        encoding = "utf-8" if encoding == "utf-8-sig" else encoding
    dec = codecs.getincrementaldecoder(encoding)("replace")
    return dec.decode(data, final=final)


def _suffix_shape(suf: re.Pattern[str] | None) -> str | None:
    """A learnt suffix as people read it: its separators, each after one blank (`` |``)."""
    if suf is None:
        return None
    return "".join(" " + re.sub(r"\\(.)", r"\1", sep) for sep in suf.pattern[: -len(_TAIL)].split(_BLANKS)[1:])


def _rewrite(text: str, learnt: Learnt, env: Envelope) -> Unwrapped:
    """Every line without its wrapper (lines that lack it are kept as they are), as UTF-8, with its source (when
    the wrappers' names differ). With no sources to keep and no colour codes before a wrapper, one substitution
    over the whole text does it (a 20 MB log in a CI stamp: 0.1 s, not the 1.2 s of a pass per line)."""
    pre, suf = learnt.prefix, learnt.suffix
    if not learnt.names and "\x1b" not in text and "^[[" not in text:
        taken = 0
        if pre is not None:
            text, taken = re.compile("^(?:" + pre.pattern + ")", re.M).subn("", text)
        if suf is not None:
            text = suf.sub(lambda m: "\r" if m.group(0).endswith("\r") else "", text)
        env = Envelope(env.encoding, env.bom, env.line_ends, learnt.shape, _suffix_shape(suf), learnt.example, taken)
        return Unwrapped(text.encode("utf-8", "surrogateescape"), None, env)
    lines = text.split("\n")
    out: list[str] = []
    sources: list[str | None] | None = [] if learnt.names else None
    taken = 0
    for raw in lines:
        cr = raw.endswith("\r")
        s = raw[:-1] if cr else raw
        src = None
        if pre is not None:
            plain = strip_ansi(s) if "[" in s[:64] else s
            m = pre.match(plain)
            if m is not None:
                src = _names(m.group(0)) if sources is not None else None
                s = plain[m.end():]
                taken += 1
        if suf is not None:
            m2 = suf.search(s)
            if m2 is not None:
                s = s[: m2.start()]
        out.append(s + ("\r" if cr else ""))
        if sources is not None:
            sources.append(src)
    data = "\n".join(out).encode("utf-8", "surrogateescape")
    env = Envelope(env.encoding, env.bom, env.line_ends, learnt.shape, _suffix_shape(suf), learnt.example, taken)
    return Unwrapped(data, sources, env)
