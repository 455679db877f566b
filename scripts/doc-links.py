#!/usr/bin/env python3
"""Checks that the documentation's links resolve (scripts/test.sh runs it; seconds, no build).

- every relative Markdown link and image in README.md, docs/guide/src/ and docs/notes/
  names a file that exists and, with `#anchor`, a heading of that file (anchors as GitHub
  and mdBook make them: lower case, spaces to `-`, other punctuation dropped);
- docs/guide/src/SUMMARY.md lists every chapter file of the guide, and each file it lists exists
  and is a doctest (`include_str!` in src/lib.rs, so that its Rust blocks compile);
- every path `docs/….md` (and README.md with an anchor) named in the code, the tests, the scripts
  and the docs exists (and so does the anchor).

Prints each broken link with its file and line, and exits 1 if there is any.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
GUIDE = os.path.join(ROOT, 'docs', 'guide', 'src')
errors = []


def md_files():
    yield os.path.join(ROOT, 'README.md')
    for top in (GUIDE, os.path.join(ROOT, 'docs', 'notes')):
        for d, _, names in os.walk(top):
            for n in sorted(names):
                if n.endswith('.md'):
                    yield os.path.join(d, n)


def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code removed."""
    fence = None
    for i, line in enumerate(text.split('\n'), 1):
        m = re.match(r'^\s*(```+|~~~+)', line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield i, re.sub(r'`+[^`]*`+', '', line)


def slug(heading):
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link keeps its text
    text = text.replace('`', '').replace('*', '')
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in '-_':
            out.append(ch)
        elif ch.isspace():
            out.append('-')
    return ''.join(out)


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        found = set()
        fence = None
        for line in open(path, encoding='utf-8').read().split('\n'):
            m = re.match(r'^\s*(```+|~~~+)', line)
            if m:
                fence = m.group(1) if fence is None else (None if line.strip().startswith(fence) else fence)
                continue
            h = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line) if fence is None else None
            if h:
                s = slug(h.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f'{s}-{n}')
            for a in re.findall(r'<a (?:name|id)="([^"]+)"', line):
                found.add(a)
        _anchors[path] = found
    return _anchors[path]


def check_target(src, lineno, target, base):
    path, _, anchor = target.partition('#')
    full = os.path.normpath(os.path.join(base, path)) if path else src
    where = f'{os.path.relpath(src, ROOT)}:{lineno}'
    if not os.path.exists(full):
        errors.append(f'{where}: {target}: no such file')
    elif anchor and full.endswith('.md') and anchor not in anchors(full):
        errors.append(f'{where}: {target}: no heading #{anchor} in {os.path.relpath(full, ROOT)}')


LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
for f in md_files():
    for lineno, line in prose_lines(open(f, encoding='utf-8').read()):
        for target in LINK.findall(line):
            if re.match(r'^[a-z]+:', target):
                continue
            check_target(f, lineno, target, os.path.dirname(f))

summary = os.path.join(GUIDE, 'SUMMARY.md')
listed = set()
for lineno, line in prose_lines(open(summary, encoding='utf-8').read()):
    for target in LINK.findall(line):
        listed.add(os.path.normpath(os.path.join(GUIDE, target.partition('#')[0])))
for d, _, names in os.walk(GUIDE):
    for n in names:
        p = os.path.join(d, n)
        if n.endswith('.md') and n != 'SUMMARY.md' and p not in listed:
            errors.append(f'{os.path.relpath(p, ROOT)}: not listed in docs/guide/src/SUMMARY.md')

lib_rs = open(os.path.join(ROOT, 'src', 'lib.rs'), encoding='utf-8').read()
for p in sorted(listed):
    rel = os.path.relpath(p, ROOT)
    if f'include_str!("../{rel}")' not in lib_rs:
        errors.append(f'{rel}: not a doctest: no #[doc = include_str!("../{rel}")] in src/lib.rs')

MENTION = re.compile(r'(?<![\w./-])((?:docs/[\w./-]+\.md|README\.md)(?:#[\w-]+)?)')
for top in ('src', 'handlers', 'tests', 'scripts', 'docs', 'README.md', 'build.rs'):
    start = os.path.join(ROOT, top)
    walk = [(os.path.dirname(start), [], [os.path.basename(start)])] if os.path.isfile(start) else os.walk(start)
    for d, dirs, names in walk:
        dirs[:] = [x for x in dirs if x not in ('target', '.git')]
        for n in names:
            if not n.endswith(('.rs', '.md', '.sh', '.py', '.toml')):
                continue
            p = os.path.join(d, n)
            for lineno, line in enumerate(open(p, encoding='utf-8', errors='replace'), 1):
                for target in MENTION.findall(line):
                    check_target(p, lineno, target, ROOT)

for e in errors:
    print(e)
if errors:
    print(f'doc-links: {len(errors)} broken link(s)', file=sys.stderr)
    sys.exit(1)
print('doc-links: every link resolves')
