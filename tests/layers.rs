//! The layering of `plugin/`, drawn from its imports (docs/architecture.md): every
//! `crate::module` path in a module's source must point at the same or a lower layer, the
//! engine may use only the transport's data types (work requests and completions, never a
//! device or a QP), and the modules import each other without cycles.
//!
//! Layers, top to bottom:
//!
//! | layer | modules |
//! |---|---|
//! | 5 ABI | `ffi` |
//! | 4 plugin API | `api`, `testkit` (test support over the API) |
//! | 3 comms and set-up | `comm` (with `comm::pool`), `conn`, `net`, `limits` |
//! | 2 protocol and transports | `engine`, `transport` (with its exported conformance macro) |
//! | 1 foundations | `config`, `ifselect`, `log`, `error` |
//! | 0 raw memory | `mem` |
//!
//! A path is read from code, not from comments (`//` lines are skipped), so a docstring may
//! still name an upper layer when it explains who calls a function.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn layer(module: &str) -> Option<u8> {
    Some(match module {
        "ffi" => 5,
        "api" | "testkit" => 4,
        "comm" | "conn" | "net" | "limits" => 3,
        "engine" | "transport" | "transport_conformance" => 2,
        "config" | "ifselect" | "log" | "error" => 1,
        "mem" => 0,
        _ => return None,
    })
}

/// What the engine may name from the transport: the verbs-shaped data it emits and consumes.
const ENGINE_MAY_USE: &[&str] = &[
    "SendWr",
    "RecvWr",
    "Sge",
    "Wc",
    "WcStatus",
    "WcOpcode",
    "SendOpcode",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read plugin/") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file under `plugin/` belongs to (`plugin/transport/tcp/qp.rs` →
/// `transport`), or `None` for the crate root.
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).expect("under plugin/");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let m = first.trim_end_matches(".rs").to_string();
    (m != "lib").then_some(m)
}

/// Every `crate::a::b...` path in the code of `src` (comments skipped), as its segments.
fn crate_paths(src: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in src.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split(" //").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let tail = &rest[i + "crate::".len()..];
            let path: Vec<String> = tail
                .split("::")
                .map(|seg| {
                    seg.chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .take_while(|s| !s.is_empty())
                .collect();
            // `use crate::transport::{SendWr, Wc}`: the names in braces.
            let after = tail.find('{').filter(|&b| {
                tail[..b]
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
            });
            if let Some(b) = after {
                let names = tail[b + 1..].split('}').next().unwrap_or("");
                for name in names.split(',') {
                    let name = name.trim();
                    if !name.is_empty() {
                        let mut p = path.clone();
                        p.push(name.split("::").next().unwrap_or(name).to_string());
                        out.push(p);
                    }
                }
            } else if !path.is_empty() {
                out.push(path);
            }
            rest = tail;
        }
    }
    out
}

/// (from module, to module) → the files and paths that make the edge.
fn import_graph() -> BTreeMap<(String, String), Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugin");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for f in files {
        let Some(from) = module_of(&root, &f) else {
            continue;
        };
        let src = std::fs::read_to_string(&f).expect("read source");
        for path in crate_paths(&src) {
            let to = path[0].clone();
            if to == from {
                continue;
            }
            let where_ = format!(
                "{}: crate::{}",
                f.strip_prefix(&root).unwrap().display(),
                path.join("::")
            );
            edges.entry((from.clone(), to)).or_default().push(where_);
        }
    }
    edges
}

#[test]
fn modules_import_only_downwards() {
    let mut wrong = Vec::new();
    for ((from, to), sites) in import_graph() {
        let (Some(lf), Some(lt)) = (layer(&from), layer(&to)) else {
            wrong.push(format!(
                "{from} -> {to}: a module missing from this test's layer table ({})",
                sites[0]
            ));
            continue;
        };
        if lt > lf {
            wrong.push(format!(
                "{from} (layer {lf}) -> {to} (layer {lt}): {sites:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "upward imports:\n{}", wrong.join("\n"));
}

#[test]
fn the_engine_uses_only_the_transports_data_types() {
    let mut wrong = Vec::new();
    for ((from, to), sites) in import_graph() {
        if from != "engine" {
            continue;
        }
        for s in &sites {
            let path = s.split("crate::").nth(1).unwrap_or("");
            let segs: Vec<&str> = path.split("::").collect();
            let ok = to == "transport" && segs.len() >= 2 && ENGINE_MAY_USE.contains(&segs[1]);
            if !ok {
                wrong.push(s.clone());
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the engine must stay pure (no I/O): it may name only the transport's data types \
         {ENGINE_MAY_USE:?}, found:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn there_are_no_import_cycles() {
    let graph = import_graph();
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in graph.keys() {
        next.entry(from).or_default().insert(to);
    }
    // Depth-first search for a back edge; report the cycle with the sites of its edges.
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(i) = stack.iter().position(|&s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n);
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n);
        for &m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n);
        None
    }
    let mut done = BTreeSet::new();
    for &n in next.keys() {
        if let Some(cycle) = visit(n, &next, &mut Vec::new(), &mut done) {
            let sites: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let s = &graph[&(w[0].to_string(), w[1].to_string())];
                    format!("{} -> {}: {}", w[0], w[1], s[0])
                })
                .collect();
            panic!("import cycle {}:\n{}", cycle.join(" -> "), sites.join("\n"));
        }
    }
}

#[test]
fn the_path_reader_sees_imports_and_skips_comments() {
    let src = "use crate::transport::{SendWr, Wc};\n// crate::ffi in a comment\n\
               let x = crate::engine::wire::MAX; // crate::api\n";
    let paths = crate_paths(src);
    assert_eq!(
        paths,
        vec![
            vec!["transport".to_string(), "SendWr".into()],
            vec!["transport".to_string(), "Wc".into()],
            vec!["engine".to_string(), "wire".into(), "MAX".into()],
        ]
    );
}
