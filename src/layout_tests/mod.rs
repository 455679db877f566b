//! The source's layout, checked: the worker's modules import one another in one direction
//! (no cycle among them, and none through the modules below the worker), and no source file
//! is longer than [`MAX_LINES`].
//!
//! The module tree is read from the files as rustc finds them (from `lib.rs`, following
//! `mod x;` and `#[path]`), and a module's imports are every path it names outside comments
//! and string literals: `use` trees (groups, globs, `as`, across lines) and paths in code
//! (`super::record::record_or_unwind(…)`), resolved from `crate::`, `super::` (repeated),
//! `self::`, a child module's name, or a name `lib.rs` re-exports (`crate::WorkerConfig`).

mod modules;
mod source;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use modules::Crate;
use source::{tokens, use_tree, Tok};

/// The longest a source file under `src/` may be (STYLE.md: split before ~500 lines).
const MAX_LINES: usize = 450;

/// A cycle of `graph`, as the modules along it, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut HashMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(true) => {
                let from = stack.iter().position(|n| n == node).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            Some(false) => return None,
            None => {}
        }
        state.insert(node.to_string(), true);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(node.to_string(), false);
        None
    }
    let mut state = HashMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut state, &mut Vec::new()))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn worker() -> Vec<String> {
    vec!["worker".to_string()]
}

#[test]
fn the_worker_imports_in_one_direction() {
    let krate = Crate::read(&src());
    let base = src().join("worker");
    let graph = krate.graph(&worker(), |path| {
        let file = &krate.modules[path].file;
        file.strip_prefix(&base).unwrap().display().to_string()
    });
    assert!(graph.len() > 20, "the worker's modules: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the worker's modules import in a circle: {}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn no_module_the_worker_uses_imports_it() {
    let krate = Crate::read(&src());
    let graph = krate.graph(&[], |path| path.first().cloned().unwrap_or("lib".into()));
    let reached = |from: &str| {
        let mut seen = BTreeSet::from([from.to_string()]);
        let mut todo = vec![from.to_string()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let back: Vec<String> = reached("worker")
        .into_iter()
        .filter(|m| m != "worker" && m != "lib" && reached(m).contains("worker"))
        .collect();
    let direct: Vec<&String> = back
        .iter()
        .filter(|m| graph[*m].contains("worker"))
        .collect();
    assert!(
        back.is_empty(),
        "modules the worker imports import it in turn: {back:?} ({direct:?} directly)"
    );
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    fn walk(dir: &Path, long: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, long);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path).unwrap().lines().count();
                if lines > MAX_LINES {
                    long.push(format!("{} ({lines} lines)", path.display()));
                }
            }
        }
    }
    let mut long = Vec::new();
    walk(&src(), &mut long);
    assert!(long.is_empty(), "longer than {MAX_LINES} lines: {long:?}");
}

#[test]
fn the_reader_sees_through_groups_lines_and_supers() {
    let toks = tokens(
        "use super::{a, b::{C, d as e}};\nuse super::super::\n  f::G; // super::h\n\
         let x = \"super::i\"; 'a'; fn f<'a>() { super::j::k(); }",
    );
    let mut i = 1;
    let mut paths = Vec::new();
    use_tree(&toks, &mut i, &[], &mut paths);
    i += 1;
    use_tree(&toks, &mut i, &[], &mut paths);
    let s = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        paths,
        vec![
            s(&["super", "a"]),
            s(&["super", "b", "C"]),
            s(&["super", "b", "d"]),
            s(&["super", "super", "f", "G"]),
        ]
    );
    assert!(
        !toks.contains(&Tok::Ident("h".into())),
        "comments are skipped"
    );
    assert!(toks.contains(&Tok::Str("super::i".into())));
    assert!(toks.contains(&Tok::Ident("j".into())));
}
