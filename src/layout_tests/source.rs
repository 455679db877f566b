//! Reading Rust source for [`super`]: its tokens (comments, chars and lifetimes dropped,
//! string literals kept whole) and its `use` trees.

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Str(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of Rust source that matter here: identifiers, `::`, punctuation and string
/// literals (kept for `#[path = "…"]`); comments, lifetimes, chars and numbers' dots dropped.
pub(super) fn tokens(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let (mut out, mut i) = (Vec::new(), 0);
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (0, i);
            loop {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            i = j;
        } else if (c == 'r' || c == 'b') && raw_string_start(&s, i).is_some() {
            let (hashes, body) = raw_string_start(&s, i).unwrap();
            let closing: Vec<char> = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            let mut j = body;
            while s[j..].iter().take(closing.len()).ne(closing.iter()) {
                j += 1;
            }
            out.push(Tok::Str(s[body..j].iter().collect()));
            i = j + closing.len();
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let start = j;
            while s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            out.push(Tok::Str(s[start..j].iter().collect()));
            i = j + 1;
        } else if c == '\'' || (c == 'b' && next == Some('\'')) {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            let j = if c == 'b' { i + 1 } else { i };
            if s.get(j + 1) == Some(&'\\') {
                let mut k = j + 3;
                while s[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if s.get(j + 2) == Some(&'\'') {
                i = j + 3;
            } else {
                i = j + 1;
                while i < s.len() && ident(s[i]) {
                    i += 1;
                }
            }
        } else if ident(c) {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            out.push(Tok::Ident(s[start..i].iter().collect()));
        } else if c == ':' && next == Some(':') {
            out.push(Tok::Sep);
            i += 2;
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

/// At `r"`, `r#"`, `br"`, `br#"`: the number of `#` and where the body starts.
fn raw_string_start(s: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_') {
        return None;
    }
    let mut j = i + usize::from(s[i] == 'b');
    if s.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&c| c == '#').count();
    (s.get(j + hashes) == Some(&'"')).then_some((hashes, j + hashes + 1))
}

/// One module of the crate: its path from the crate root, the file it is written in, and
/// the paths it names (each as it is written, segments from `crate`, `super`, …).
/// The index after the bracketed group that opens at `toks[start]`.
pub(super) fn group_end(toks: &[Tok], start: usize) -> usize {
    let mut depth = 0;
    for (k, tok) in toks.iter().enumerate().skip(start) {
        match tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

pub(super) fn has_cfg_test(attrs: &[Tok]) -> bool {
    attrs.windows(4).any(|w| {
        w == [
            Tok::Ident("cfg".into()),
            Tok::Punct('('),
            Tok::Ident("test".into()),
            Tok::Punct(')'),
        ]
    })
}

pub(super) fn path_attr(attrs: &[Tok]) -> Option<String> {
    attrs.windows(3).find_map(|w| match w {
        [Tok::Ident(a), Tok::Punct('='), Tok::Str(p)] if a == "path" => Some(p.clone()),
        _ => None,
    })
}

/// Reads one use tree from `toks[*i..]` (after `use`, or inside a group) under `prefix`,
/// pushing every path it names; stops after its `;` at the top level.
pub(super) fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match &toks[*i] {
            Tok::Sep => *i += 1,
            Tok::Ident(w) if w == "as" => {
                *i += 2;
            }
            Tok::Ident(seg) => {
                path.push(seg.clone());
                *i += 1;
            }
            Tok::Punct('*') => *i += 1,
            Tok::Punct('{') => {
                *i += 1;
                while toks[*i] != Tok::Punct('}') {
                    use_tree(toks, i, &path, out);
                }
                *i += 1;
                path.clear();
            }
            Tok::Punct(',') => {
                *i += 1;
                break;
            }
            Tok::Punct('}') => break,
            Tok::Punct(';') => {
                *i += 1;
                break;
            }
            other => panic!("unexpected {other:?} in a use tree"),
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
}
