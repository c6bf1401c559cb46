"""Reading what the user did not write: downloaded logs, system JSON, configs, sweep files, metadata.

Every reader of such a file goes through here: regular files only (no FIFO, device or socket), no
link that leaves the tree being read, a size cap checked before the bytes are read, UTF-8 checked,
JSON nesting bounded, numbers checked for finiteness and range. Names taken from such files pass
through :func:`printable` before they reach a terminal, a log line or a page. Any failure is a
:class:`SpecError` naming the file and what would be valid.
"""

from __future__ import annotations

import json
import math
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any

from trainperf.core.errors import SpecError

MAX_JSON_DEPTH = 64
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def printable(value: object, limit: int = 200) -> str:
    """``value`` as text safe for a terminal: control and format characters (ANSI escapes, newlines,
    bidi overrides) shown as ``\\x1b``-style escapes, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else str(value)
    out = []
    for ch in text:
        if ch == " " or (ch.isprintable() and unicodedata.category(ch) not in ("Cf", "Zl", "Zp")):
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    safe = "".join(out)
    return safe if len(safe) <= limit else safe[: limit - 3] + "..."


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def check_inside(path: str | os.PathLike, root: str | os.PathLike, what: str = "file") -> Path:
    """The real path of ``path``, refused unless it lies inside the real path of ``root`` (a link
    that leaves the tree being read)."""
    real = Path(os.path.realpath(path))
    if not _inside(real, Path(os.path.realpath(root))):
        raise SpecError(f"{what} {printable(path)} points outside {printable(root)} (to {printable(real)}); "
                        "give a folder whose files are its own, not links elsewhere")
    return real


def read_untrusted_bytes(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                         root: str | os.PathLike | None = None, what: str = "file") -> bytes:
    """The bytes of ``path``, refused unless it is a regular file of at most ``max_bytes`` whose real
    path lies inside ``root`` (when given). Never blocks on a FIFO or reads a device."""
    path = Path(path)
    shown = printable(path)
    real = check_inside(path, root, what) if root is not None else Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except OSError as exc:
        raise SpecError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{what} {shown} is not a regular file (a FIFO, device, socket or folder); "
                        "give a plain file")
    if st.st_size > max_bytes:
        raise SpecError(f"{what} {shown} is {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since the stat, open does not wait on it
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise SpecError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpecError(f"{what} {shown} is not a regular file; give a plain file")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise SpecError(f"{what} {shown} is more than the {max_bytes:,} bytes allowed")
    except OSError as exc:
        raise SpecError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_untrusted_text(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                        root: str | os.PathLike | None = None, what: str = "file") -> str:
    data = read_untrusted_bytes(path, max_bytes=max_bytes, root=root, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{what} {printable(path)} is not UTF-8 text (byte {exc.start}); "
                        "give a UTF-8 file") from None


def json_depth_ok(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the brackets of JSON ``text`` nest at most ``max_depth`` deep (strings skipped)."""
    if text.count("[") + text.count("{") <= max_depth:  # the common case, at C speed: too few to nest deeper
        return True
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def parse_untrusted_json(text: str, *, where: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of text from an untrusted source: nesting bounded, NaN/Infinity refused."""
    if not json_depth_ok(text, max_depth):
        raise SpecError(f"{printable(where)}: JSON nested more than {max_depth} deep")

    def no_constant(name: str):
        raise SpecError(f"{printable(where)}: JSON holds {name}, which is not a number; give finite numbers")

    try:
        return json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"{printable(where)}: not valid JSON ({printable(exc, 120)})") from None


def load_untrusted_json(path: str | os.PathLike, *, max_bytes: int = 16 * 1024 * 1024,
                        root: str | os.PathLike | None = None, what: str = "JSON file",
                        max_depth: int = MAX_JSON_DEPTH) -> Any:
    text = read_untrusted_text(path, max_bytes=max_bytes, root=root, what=what)
    return parse_untrusted_json(text, where=f"{what} {path}", max_depth=max_depth)


MAX_YAML_NODES = 100_000  # values a YAML document may hold once its aliases are expanded


def _yaml_expanded_size(root, where: str, max_nodes: int, max_depth: int) -> int:
    """How many values the node graph ``root`` holds with every alias expanded, and how deep it nests,
    computed on the graph (each anchored node once), never by expanding it. SpecError on a cycle (a
    recursive anchor), on more than ``max_nodes`` values or nesting beyond ``max_depth``."""
    import yaml  # the YAML reader loads only for a YAML file

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:  # iterative post-order: a 100k-deep document must not exhaust Python's stack
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            kids = _yaml_children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if depth[key] > max_depth:
                raise SpecError(f"{printable(where)}: values nested more than {max_depth} deep")
            continue
        if key in size:
            continue
        if key in on_path:
            mark = node.start_mark
            raise SpecError(f"{printable(where)}: line {mark.line + 1}, column {mark.column + 1}: a recursive anchor "
                            "(an alias inside the value it names); give each value without referring to itself")
        on_path.add(key)
        stack.append((node, True))
        if not isinstance(node, yaml.ScalarNode):
            stack.extend((k, False) for k in _yaml_children(node) if id(k) not in size)
        if len(on_path) > max_depth:
            raise SpecError(f"{printable(where)}: values nested more than {max_depth} deep")
    total = size[id(root)]
    if total > max_nodes:  # counted on the graph: nothing was expanded to find it
        raise SpecError(f"{printable(where)}: its aliases expand to {total:,} values, more than the {max_nodes:,} "
                        "allowed; write the values out, or use fewer aliases")
    return total


def _yaml_children(node) -> list:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def parse_untrusted_yaml(text: str, *, where: str, max_nodes: int = MAX_YAML_NODES,
                         max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``yaml.safe_load`` of text from an untrusted source, its node graph checked before a Python object
    is built: a recursive anchor, an alias expansion ("billion laughs") beyond ``max_nodes`` values and
    nesting beyond ``max_depth`` are refused, each as one SpecError line naming the place or the count."""
    import yaml

    loader = None
    try:
        loader = yaml.SafeLoader(text)  # pure Python: deep recursion ends in RecursionError, not a crash
        node = loader.get_single_node()
        if node is None:
            return None
        _yaml_expanded_size(node, where, max_nodes, max_depth)
        return loader.construct_document(node)
    except RecursionError:
        raise SpecError(f"{printable(where)}: values nested more than {max_depth} deep") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a control character, say)
        raise SpecError(f"{printable(where)} could not be parsed: character {exc.character!r} at position "
                        f"{exc.position} is not allowed in YAML; give printable text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        what = getattr(exc, "problem", None) or type(exc).__name__
        place = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise SpecError(f"{printable(where)} could not be parsed: {place}{printable(what, 120)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def finite_number(value: object, name: str, *, lo: float | None = None, hi: float | None = None,
                  lo_open: bool = False) -> float:
    """``value`` as a finite float within [lo, hi] (``(lo, hi]`` with ``lo_open``), else a SpecError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecError(f"{name} is {printable(repr(value), 60)}; give a number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise SpecError(f"{name} is {printable(repr(value), 60)}; give a number") from None
    if not math.isfinite(number):
        raise SpecError(f"{name} is {printable(value, 60)}; give a finite number")
    if lo is not None and (number < lo or (lo_open and number == lo)):
        raise SpecError(f"{name} is {number:g}; give a number {'above' if lo_open else 'at least'} {lo:g}")
    if hi is not None and number > hi:
        raise SpecError(f"{name} is {number:g}; give a number at most {hi:g}")
    return number


def split_lines(text: str, *, max_chars: int, where: str, containing: str | None = None) -> list[str]:
    """``text`` split as Python reads a text file (``\\n``, ``\\r\\n`` and ``\\r`` end a line), refused
    when a line (one holding ``containing``, when given) is longer than ``max_chars``: a reader that
    is slow in a line's length never sees a long one."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if len(line) > max_chars and (containing is None or containing in line):
            raise SpecError(f"{printable(where)} line {number} is {len(line):,} characters, more than the "
                            f"{max_chars:,} allowed; not a log this reader takes")
    return lines


def whole_number(value: object, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` (a number, or text holding one) as an int within [lo, hi], else a SpecError."""
    number = finite_number(value, name, lo=lo, hi=hi)
    if number != int(number):
        raise SpecError(f"{name} is {number:g}; give a whole number")
    return int(number)


def member_file(root: str | os.PathLike, name: object, *, what: str = "file", links_out: bool = False,
                index: str = "the index") -> Path:
    """The file an untrusted index names (a shard of a checkpoint, a data file of a DCP folder) as a
    path inside ``root``: a relative name with no ``..`` part whose real path stays inside ``root``
    (with ``links_out``, a link may lead elsewhere, as a Hugging Face cache snapshot's do) and is a
    regular file. Never opens it; a SpecError for an absolute name, a climb out, a link out, or a
    missing or special file. ``index`` names, in messages, the file that named it."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise SpecError(f"{what} name {printable(repr(name), 80)} is not a file name; give names relative "
                        f"to {printable(root)}")
    parts = Path(name).parts
    if Path(name).is_absolute() or name.startswith(("/", "\\")) or ".." in parts or ".." in name.split("\\"):
        raise SpecError(f"{what} {printable(name)} is not inside {printable(root)} (an absolute name or a '..' "
                        f"part); {index} may only name files in its own folder")
    path = Path(root) / name
    real = Path(os.path.realpath(path))
    if not links_out and not _inside(real, Path(os.path.realpath(root))):
        raise SpecError(f"{what} {printable(name)} points outside {printable(root)} (to {printable(real)}); "
                        "give a folder whose files are its own, not links elsewhere")
    try:
        st = os.stat(real)
    except OSError as exc:
        raise SpecError(f"{what} {printable(name)} named in {index} is missing from {printable(root)} "
                        f"({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{what} {printable(name)} in {printable(root)} is not a regular file (a FIFO, device, "
                        "socket or folder); give a plain file")
    return path
