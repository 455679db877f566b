//! The crate's module tree as rustc finds it, and the import graph among its modules.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::source::{group_end, has_cfg_test, path_attr, tokens, use_tree, Tok};

#[derive(Debug, Default)]
pub(super) struct Module {
    pub(super) file: PathBuf,
    /// Declared `#[cfg(test)]`: its imports count as its parent's.
    test: bool,
    /// Written inline (`mod x { … }`): its imports count as its file's.
    inline: bool,
    named: Vec<Vec<String>>,
}

/// The crate's modules, by path (`[]` is the crate root).
pub(super) struct Crate {
    pub(super) modules: BTreeMap<Vec<String>, Module>,
    /// What `lib.rs` re-exports: `crate::Worker` → `[worker, Worker]`.
    root_uses: HashMap<String, Vec<String>>,
}

impl Crate {
    pub(super) fn read(src: &Path) -> Crate {
        let mut krate = Crate {
            modules: BTreeMap::new(),
            root_uses: HashMap::new(),
        };
        krate.read_file(&src.join("lib.rs"), Vec::new(), src.to_path_buf(), false);
        for path in &krate.modules[&Vec::new()].named {
            if let Some(name) = path.last().filter(|_| path.len() > 1 && path[0] != "crate") {
                krate.root_uses.insert(name.clone(), path.clone());
            }
        }
        krate
    }

    fn read_file(&mut self, file: &Path, path: Vec<String>, dir: PathBuf, test: bool) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let toks = tokens(&text);
        let module = Module {
            file: file.to_path_buf(),
            test,
            ..Module::default()
        };
        self.modules.insert(path.clone(), module);
        let mut i = 0;
        let here = file.parent().unwrap().to_path_buf();
        self.read_items(&toks, &mut i, &path, file, &dir, &here);
    }

    /// Reads the items of module `path` from `toks[*i..]` up to its closing `}` (or the
    /// end): its child modules and the paths it names.
    /// `dir` holds the files of its child modules; `#[path]` is relative to `here`.
    fn read_items(
        &mut self,
        toks: &[Tok],
        i: &mut usize,
        path: &[String],
        file: &Path,
        dir: &Path,
        here: &Path,
    ) {
        let mut attrs: Vec<Tok> = Vec::new();
        let mut depth = 0usize;
        while *i < toks.len() {
            let tok = &toks[*i];
            match tok {
                Tok::Punct('#') if matches!(toks.get(*i + 1), Some(Tok::Punct('[' | '!'))) => {
                    let end =
                        group_end(toks, *i + 1 + usize::from(toks[*i + 1] == Tok::Punct('!')));
                    attrs.extend_from_slice(&toks[*i..end]);
                    *i = end;
                    continue;
                }
                Tok::Ident(w) if w == "pub" => {
                    *i += 1;
                    if toks[*i] == Tok::Punct('(') {
                        *i = group_end(toks, *i);
                    }
                    continue;
                }
                Tok::Ident(w) if w == "mod" => {
                    let Tok::Ident(name) = &toks[*i + 1] else {
                        panic!("mod in {file:?}")
                    };
                    let mut child = path.to_vec();
                    child.push(name.clone());
                    let test = has_cfg_test(&attrs);
                    if toks[*i + 2] == Tok::Punct('{') {
                        self.modules.insert(
                            child.clone(),
                            Module {
                                file: file.to_path_buf(),
                                test,
                                inline: true,
                                ..Module::default()
                            },
                        );
                        *i += 3;
                        let dir = dir.join(name);
                        self.read_items(toks, i, &child, file, &dir, &dir);
                    } else {
                        let child_file = match path_attr(&attrs) {
                            Some(p) => here.join(p),
                            None if dir.join(format!("{name}.rs")).exists() => {
                                dir.join(format!("{name}.rs"))
                            }
                            None => dir.join(name).join("mod.rs"),
                        };
                        let child_dir = match child_file.file_name() {
                            Some(f) if f == "mod.rs" => child_file.parent().unwrap().to_path_buf(),
                            _ => dir.join(name),
                        };
                        self.read_file(&child_file, child, child_dir, test);
                        *i += 3;
                    }
                    attrs.clear();
                    continue;
                }
                Tok::Ident(w) if w == "use" => {
                    *i += 1;
                    let mut paths = Vec::new();
                    use_tree(toks, i, &[], &mut paths);
                    self.modules.get_mut(path).unwrap().named.extend(paths);
                    attrs.clear();
                    continue;
                }
                Tok::Ident(_) if *i == 0 || toks[*i - 1] != Tok::Sep => {
                    let mut named = Vec::new();
                    let mut j = *i;
                    while let (Some(Tok::Ident(seg)), Some(Tok::Sep)) =
                        (toks.get(j), toks.get(j + 1))
                    {
                        named.push(seg.clone());
                        j += 2;
                    }
                    if let (false, Some(Tok::Ident(last))) = (named.is_empty(), toks.get(j)) {
                        named.push(last.clone());
                        self.modules.get_mut(path).unwrap().named.push(named);
                    }
                }
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') if depth == 0 => {
                    *i += 1;
                    return;
                }
                Tok::Punct('}') => depth -= 1,
                _ => {}
            }
            attrs.clear();
            *i += 1;
        }
    }

    /// The module that `named`, written in module `at`, refers to: the deepest module its
    /// path reaches (`None`: outside the crate).
    fn resolve(&self, at: &[String], named: &[String]) -> Option<Vec<String>> {
        let mut base: Vec<String> = at.to_vec();
        let mut rest = named;
        match named.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &named[1..];
                if let Some(alias) = rest.first().and_then(|n| self.root_uses.get(n)) {
                    return Some(self.deepest(Vec::new(), alias));
                }
            }
            Some("self") => rest = &named[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = at.to_vec();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
            }
            None => return None,
        }
        Some(self.deepest(base, rest))
    }

    fn deepest(&self, mut base: Vec<String>, rest: &[String]) -> Vec<String> {
        for seg in rest {
            base.push(seg.clone());
            if !self.modules.contains_key(&base) {
                base.pop();
                break;
            }
        }
        base
    }

    /// The module whose imports `path`'s count as: the nearest file module, itself or an
    /// ancestor, that is not a test module.
    fn owner(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        while self.modules[&path].inline || self.modules[&path].test {
            path.pop();
        }
        path
    }

    /// The import graph among the modules under `within` (each grouped by `group`), from
    /// module to the modules it names.
    pub(super) fn graph(
        &self,
        within: &[String],
        group: impl Fn(&[String]) -> String,
    ) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (path, module) in &self.modules {
            if !path.starts_with(within) {
                continue;
            }
            let from = group(&self.owner(path));
            let edges = graph.entry(from.clone()).or_default();
            for named in &module.named {
                let Some(to) = self.resolve(path, named) else {
                    continue;
                };
                if !to.starts_with(within) {
                    continue;
                }
                let to = group(&self.owner(&to));
                if to != from {
                    edges.insert(to);
                }
            }
        }
        graph
    }
}
