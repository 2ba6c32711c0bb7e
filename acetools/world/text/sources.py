"""Real, offline labelled text: each :class:`Source` reads files of Debian packages (or docstrings of
installed Python libraries) as ``{label: [text, ...]}`` and names what it reads, so a task's cache key
records their versions (:func:`provenance`); a missing package is a :class:`SourceMissing` error naming
it (docs/text-world.md §The tasks)."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import chain
from pathlib import Path

__all__ = ["Source", "SOURCES", "SourceMissing", "provenance", "debian_version", "WORDNET_LEXNAMES"]

#: The sources' static tables (WordNet's lexicographer files, word lists, hypernym classes, code packages,
#: documented libraries).
_DATA = json.loads(Path(__file__).with_name("sources.json").read_text(encoding="utf-8"))


class SourceMissing(FileNotFoundError):
    """A text source's files are not installed."""


@dataclass(frozen=True)
class Source:
    """A reader of labelled text: ``read() -> {label: [texts]}`` from ``debs`` / ``pydists``; ``classes``: its
    labels where the source fixes them."""

    name: str
    read: Callable[[], dict[str, list[str]]]
    debs: tuple[str, ...] = ()
    pydists: tuple[str, ...] = ()
    doc: str = ""
    classes: tuple[str, ...] = ()


def debian_version(package: str) -> str | None:
    """The installed version of a Debian package (``dpkg-query``), or None."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _py_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def provenance(source: Source) -> dict[str, str | None]:
    """Versions of what ``source`` reads: ``{"deb:<pkg>": version, "py:<dist>": version}``."""
    out: dict[str, str | None] = {f"deb:{p}": debian_version(p) for p in source.debs}
    out.update({f"py:{d}": _py_version(d) for d in source.pydists})
    return out


def _need(path: str | Path, package: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise SourceMissing(f"{p} is missing: install the Debian package {package!r} "
                            f"(`apt-get install {package}`, or `bash scripts/setup.sh`)")
    return p


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# --------------------------------------------------------------------------- WordNet

#: The 45 lexicographer files of WordNet 3.0 by number (the Debian package stores only the numbers).
WORDNET_LEXNAMES: tuple[str, ...] = tuple(_DATA["wordnet_lexnames"])
WORDNET = "/usr/share/wordnet"


@lru_cache(maxsize=None)
def _wordnet_rows(pos: str) -> tuple[tuple[str, int, tuple[str, ...], tuple[tuple[str, str, str], ...], str], ...]:
    """``(offset, lexfile, lemmas, pointers, gloss)`` per synset of ``data.<pos>``."""
    path = _need(f"{WORDNET}/data.{pos}", "wordnet-base")
    rows = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  "):
                continue  # licence header
            head, _, gloss = line.partition(" | ")
            f = head.split()
            lexfile, n_words = int(f[1]), int(f[3], 16)
            lemmas = tuple(f[4 + 2 * i].replace("_", " ") for i in range(n_words))
            i = 4 + 2 * n_words
            n_ptr = int(f[i])
            ptrs = tuple((f[i + 1 + 4 * j], f[i + 2 + 4 * j], f[i + 3 + 4 * j]) for j in range(n_ptr))
            rows.append((f[0], lexfile, lemmas, ptrs, gloss.strip()))
    return tuple(rows)


def _definition(gloss: str) -> str:
    """A gloss's definition: the text before its first quoted example, topic tag removed."""
    d = gloss.split('"')[0].strip().rstrip(";").strip()
    d = re.sub(r"^\([^)]*\)\s*", "", d)  # "(physics) an ideal space ..." -> no topic tag
    return _clean(d)


def _wordnet_gloss_by_lexfile(pos: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for _, lexfile, _, _, gloss in _wordnet_rows(pos):
        d = _definition(gloss)
        if len(d) >= 12:
            out[WORDNET_LEXNAMES[lexfile]].append(d)
    return dict(out)


def _wordnet_domain() -> dict[str, list[str]]:
    """Glosses of synsets with a topic-domain pointer (``;c``) -> the domain's first lemma."""
    heads = {off: lemmas[0] for off, _, lemmas, _, _ in _wordnet_rows("noun")}
    out: dict[str, list[str]] = defaultdict(list)
    for pos in ("noun", "verb", "adj", "adv"):
        for _, _, _, ptrs, gloss in _wordnet_rows(pos):
            doms = {d for sym, off, p in ptrs if sym == ";c" and p == "n" and (d := heads.get(off)) is not None}
            if len(doms) == 1:
                d = _definition(gloss)
                if len(d) >= 12:
                    out[doms.pop()].append(d)
    return dict(out)


# --------------------------------------------------------------------------- fortunes

FORTUNES = "/usr/share/games/fortunes"


def _fortunes() -> dict[str, list[str]]:
    root = _need(FORTUNES, "fortunes")
    out = {}
    for p in sorted(root.iterdir()):
        if p.suffix or not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        quotes = [_clean(q) for q in text.split("\n%\n")]
        out[p.name] = [q for q in quotes if 20 <= len(q) <= 600]
    return out


# --------------------------------------------------------------------------- Unicode

UNICODE = "/usr/share/unicode"


def _emoji_groups() -> dict[str, list[str]]:
    path = _need(f"{UNICODE}/emoji/emoji-test.txt", "unicode-data")
    out: dict[str, list[str]] = defaultdict(list)
    group = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# group:"):
            group = line.split(":", 1)[1].strip()
        elif "; fully-qualified" in line and group and group != "Component":
            name = line.split("#", 1)[1].split(None, 2)[-1]  # "# 😀 E1.0 grinning face"
            out[group].append(_clean(name))
    return dict(out)


def _unicode_blocks() -> dict[str, list[str]]:
    """Character names (UnicodeData.txt) -> their block (Blocks.txt), ranges and
    algorithmic names (CJK, Hangul, Tangut) left out."""
    blocks = []
    for line in _need(f"{UNICODE}/Blocks.txt", "unicode-data").read_text().splitlines():
        m = re.match(r"^([0-9A-F]+)\.\.([0-9A-F]+); (.+)$", line)
        if m:
            blocks.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3)))
    out: dict[str, list[str]] = defaultdict(list)
    for line in _need(f"{UNICODE}/UnicodeData.txt", "unicode-data").read_text().splitlines():
        f = line.split(";")
        name = f[1]
        if name.startswith("<") or re.search(r"-[0-9A-F]{4,}$", name):
            continue
        cp = int(f[0], 16)
        for lo, hi, block in blocks:
            if lo <= cp <= hi:
                out[block].append(name.lower())
                break
    return dict(out)


# --------------------------------------------------------------------------- word lists

#: language -> (/usr/share/dict file, Debian package)
WORD_LISTS: dict[str, tuple[str, str]] = {k: (f, pkg) for k, (f, pkg) in _DATA["word_lists"].items()}


def _words() -> dict[str, list[str]]:
    """Words of at least 6 letters, lower-cased, that appear in exactly one language's list."""
    sets = {}
    for lang, (fname, pkg) in WORD_LISTS.items():
        text = _need(f"/usr/share/dict/{fname}", pkg).read_text(encoding="utf-8", errors="replace")
        sets[lang] = {w.lower() for w in text.split() if len(w) >= 6 and w.isalpha() and "'" not in w}
    count = Counter(chain.from_iterable(sets.values()))
    return {lang: sorted(w for w in s if count[w] == 1) for lang, s in sets.items()}


# --------------------------------------------------------------------------- Debian archive

DEB_SECTIONS_EXCLUDED = ("oldlibs", "metapackages", "debug", "localization", "tasks")


@lru_cache(maxsize=1)
def _dumpavail() -> tuple[tuple[str, str, str], ...]:
    """``(package, section, short description)`` of every package apt knows."""
    try:
        out = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as err:
        raise SourceMissing(f"`apt-cache dumpavail` failed ({err}); on Debian run `apt-get update` first") from err
    rows, pkg, sec, desc = [], None, None, None
    for line in out.stdout.splitlines() + [""]:
        if not line:
            if pkg and sec and desc:
                rows.append((pkg, sec.split("/")[-1], desc))
            pkg = sec = desc = None
        elif line.startswith("Package: "):
            pkg = line[9:].strip()
        elif line.startswith("Section: "):
            sec = line[9:].strip()
        elif line.startswith("Description: "):
            desc = line[13:].strip()
    if len(rows) < 1000:
        raise SourceMissing(f"`apt-cache dumpavail` listed only {len(rows)} packages: run `apt-get update` first")
    return tuple(sorted(set(rows)))


def _debian_descriptions() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    seen = set()
    for _, sec, desc in _dumpavail():
        if sec not in DEB_SECTIONS_EXCLUDED and desc.lower() not in seen and len(desc) >= 12:
            seen.add(desc.lower())
            out[sec].append(desc)
    return dict(out)


# --------------------------------------------------------------------------- WordNet hypernyms

def _wordnet_hypernym_classes(lexname: str, classes: tuple[str, ...]) -> dict[str, list[str]]:
    """Glosses of ``lexname`` nouns below exactly one of ``classes`` in WordNet's hypernym
    tree (``@`` and ``@i`` pointers) -> that class; the class synsets themselves left out.
    Each class is the first ``lexname`` synset whose first lemma is the class name."""
    rows = _wordnet_rows("noun")
    lexfile = WORDNET_LEXNAMES.index(lexname)
    hyper = {off: [o for sym, o, p in ptrs if sym in ("@", "@i") and p == "n"] for off, _, _, ptrs, _ in rows}
    target: dict[str, str] = {}
    for off, lf, lemmas, _, _ in rows:
        if lf == lexfile and lemmas[0].lower() in classes and lemmas[0].lower() not in target.values():
            target.setdefault(off, lemmas[0].lower())
    if sorted(set(target.values())) != sorted(classes):
        missing = sorted(set(classes) - set(target.values()))
        raise SourceMissing(f"WordNet has no {lexname} synset named {missing[0]!r}")
    ancestors: dict[str, frozenset[str]] = {}

    def up(off: str) -> frozenset[str]:  # iterative: the hypernym tree is deep
        stack, order = [off], []
        while stack:
            o = stack.pop()
            if o in ancestors or o in order:
                continue
            order.append(o)
            stack.extend(h for h in hyper.get(o, []) if h not in ancestors)
        for o in reversed(order):
            ancestors[o] = frozenset().union(*({h} | ancestors.get(h, frozenset()) for h in hyper.get(o, [])))
        return ancestors[off]

    out: dict[str, list[str]] = defaultdict(list)
    for off, lf, _, _, gloss in rows:
        if lf != lexfile or off in target:
            continue
        hits = {target[o] for o in up(off) if o in target}
        d = _definition(gloss)
        if len(hits) == 1 and len(d) >= 12:
            out[hits.pop()].append(d)
    return dict(out)


#: The classes of the WordNet hypernym sources (``wordnet_<kind>``).
HYPERNYM_CLASSES: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _DATA["hypernym_classes"].items()}


# --------------------------------------------------------------------------- source code

#: language -> (Debian package pattern, file suffixes, path parts to skip)
CODE_PACKAGES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    lang: (pattern, tuple(suffixes), tuple(skip)) for lang, (pattern, suffixes, skip) in _DATA["code_packages"].items()}
_CODE_MARKS = set("(){}[]=$;<>@&|\\")


def _package_files(pattern: str) -> list[Path]:
    """The regular files that the installed Debian packages matching ``pattern`` own (``dpkg -L``)."""
    files = []
    for pkg in pattern.split():
        try:
            names = subprocess.run(["dpkg-query", "-W", "-f=${Package}\\n", pkg], capture_output=True, text=True,
                                   timeout=30).stdout.split()
        except (OSError, subprocess.SubprocessError) as err:
            raise SourceMissing(f"dpkg-query failed ({err}): the code source needs a Debian system") from err
        if not names:
            raise SourceMissing(f"no installed Debian package matches {pkg!r}: `apt-get install {pkg.rstrip('.*')}`"
                                f" (or `bash scripts/setup.sh`)")
        for name in names:
            out = subprocess.run(["dpkg", "-L", name], capture_output=True, text=True, timeout=60).stdout
            files.extend(Path(f) for f in out.splitlines() if Path(f).is_file() and not Path(f).is_symlink())
    return sorted(set(files))


def _code_lines() -> dict[str, list[str]]:
    """Lines of source code (25-160 characters, at least two of ``(){}[]=$;<>@&|\\``, no comment
    lines) from the files of Debian packages -> the language they are written in."""
    out = {}
    for lang, (pattern, suffixes, skip) in CODE_PACKAGES.items():
        seen = set()
        for f in _package_files(pattern):
            if (suffixes != ("",) and f.suffix not in suffixes) or skip and set(f.parts) & set(skip):
                continue
            if suffixes == ("",) and "completions" not in f.parts:
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for line in text.splitlines():
                s = _clean(line)
                if 25 <= len(s) <= 160 and s[0] not in "#/*;-%'\"=" and sum(c in _CODE_MARKS for c in s) >= 2:
                    seen.add(s)
        out[lang] = sorted(seen)
    return out


# --------------------------------------------------------------------------- docstrings

DOC_LIBRARIES: tuple[str, ...] = tuple(_DATA["doc_libraries"])
_DIST: dict[str, str] = _DATA["distributions"]


def _docstrings() -> dict[str, list[str]]:
    """First paragraph of the docstrings of public callables, per library (sub-modules
    that import cleanly; the library's name and module paths removed from the text)."""
    out: dict[str, list[str]] = {}
    for lib in DOC_LIBRARIES:
        try:
            root = importlib.import_module(lib)
        except ImportError:
            continue
        seen, texts = set(), []
        mods = [root] + [getattr(root, a) for a in sorted(dir(root)) if inspect.ismodule(getattr(root, a, None))]
        for mod in mods:
            if not getattr(mod, "__name__", "").startswith(lib):
                continue
            for a in sorted(dir(mod)):
                if a.startswith("_"):
                    continue
                obj = getattr(mod, a, None)
                if not callable(obj) or id(obj) in seen:
                    continue
                seen.add(id(obj))
                doc = inspect.getdoc(obj) or ""
                para = _clean(doc.split("\n\n")[0])
                para = re.sub(rf"\b{lib}\b\.?", "", para, flags=re.I)
                if 20 <= len(para) <= 400:
                    texts.append(para)
        out[lib] = sorted(set(texts))
    return out


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("wordnet_noun", lambda: _wordnet_gloss_by_lexfile("noun"), ("wordnet-base",),
           doc="WordNet noun glosses -> lexicographer file"),
    Source("wordnet_verb", lambda: _wordnet_gloss_by_lexfile("verb"), ("wordnet-base",),
           doc="WordNet verb glosses -> lexicographer file"),
    Source("wordnet_domain", _wordnet_domain, ("wordnet-base",),
           doc="WordNet glosses with a topic domain -> the domain"),
    Source("fortunes", _fortunes, ("fortunes", "fortunes-min"), doc="fortune quotes -> fortune file (topic)"),
    Source("emoji", _emoji_groups, ("unicode-data",), doc="emoji names -> emoji group"),
    Source("unicode_block", _unicode_blocks, ("unicode-data",), doc="character names -> Unicode block"),
    Source("words", _words, tuple(pkg for _, pkg in WORD_LISTS.values()), doc="words -> language"),
    Source("debian_description", _debian_descriptions, ("apt",),
           doc="Debian package short descriptions -> archive section"),
    *(Source(f"wordnet_{kind}", partial(_wordnet_hypernym_classes, f"noun.{kind}", classes), ("wordnet-base",),
             doc=f"WordNet {kind} glosses -> the kind of {kind} above them ({classes[0]}, {classes[1]}, ...)",
             classes=classes)
      for kind, classes in HYPERNYM_CLASSES.items()),
    Source("code", _code_lines, tuple(p for pat, _, _ in CODE_PACKAGES.values() for p in pat.split()),
           doc="lines of source code from Debian packages -> programming language", classes=tuple(CODE_PACKAGES)),
    Source("docstrings", _docstrings, pydists=tuple(_DIST.get(d, d) for d in DOC_LIBRARIES),
           doc="docstrings of installed libraries -> library"),
)}
