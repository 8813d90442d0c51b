//! The layering of `plugin/`, drawn from its imports (docs/architecture.md): every path a
//! top-level module's code names in another top-level module must point at the same or a lower
//! layer, the engine may use only the transport's data types (work requests and completions,
//! never a device or a QP), and modules import each other without cycles, at every level:
//! between the top-level modules, and between the submodules of one module (siblings such as
//! `transport::ib::device` and `transport::ib::qp`).
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
//! How paths are read: the source is lexed (comments, string and character literals dropped, so
//! a docstring may still name an upper layer when it explains who calls a function); every path
//! that starts with `crate::`, `super::` or `self::` (also inside `use` trees with nested braces,
//! across lines), or with a name a `use` bound to a module (`use crate::transport::{self}`, then
//! `transport::tcp::TcpDevice`), is resolved to an absolute path and then to the innermost module
//! it names (files and inline `mod name { .. }` blocks). An import between two modules where one
//! contains the other (a child using its parent's items, a parent its child's) is containment,
//! not an edge; any other import is an edge between the two siblings below their common
//! ancestor. Test code (`#[cfg(test)]` modules, inline or in their own file) counts for the
//! layering but not for cycles: a module's tests may use a fixture that uses the module.

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

// ------------------------------------------------------------------------------------------
// Lexing.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    /// Any other punctuation character.
    Punct(char),
}

/// The tokens of `src`: identifiers (keywords included), `::` and single punctuation; comments,
/// string, byte-string, raw-string and character literals, lifetimes and numbers dropped.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_start = |ch: char| ch.is_alphabetic() || ch == '_';
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (ch == 'r' || (ch == 'b' && next == Some('r')))
            && matches!(
                c.get(i + if ch == 'b' { 2 } else { 1 }),
                Some('"') | Some('#')
            )
        {
            // Raw string: r"..", r#".."#, br"..".
            let mut j = i + if ch == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                // `r#ident` (a raw identifier): take the identifier.
                let s = j;
                while j < c.len() && ident_char(c[j]) {
                    j += 1;
                }
                out.push(Tok::Ident(c[s..j].iter().collect()));
                i = j;
                continue;
            }
            j += 1;
            'raw: while j < c.len() {
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                j += 1;
            }
            i = j;
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            let mut j = i + if ch == 'b' { 2 } else { 1 };
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            i = j + 1;
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            // A character literal ('x', '\n', '\u{..}', b'x') or a lifetime ('a).
            let j = i + if ch == 'b' { 2 } else { 1 };
            if c.get(j) == Some(&'\\') {
                let mut k = j + 1;
                while k < c.len() && c[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if c.get(j + 1) == Some(&'\'') {
                i = j + 2;
            } else {
                // Lifetime: skip the quote and its name.
                let mut k = j;
                while k < c.len() && ident_char(c[k]) {
                    k += 1;
                }
                i = k;
            }
        } else if ident_start(ch) {
            let s = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push(Tok::Ident(c[s..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (ident_char(c[i]) || c[i] == '.') {
                if c[i] == '.' && !c.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                    break;
                }
                i += 1;
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Tok::Path);
            i += 2;
        } else if ch.is_whitespace() {
            i += 1;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// Paths.

/// One path a module's code names, resolved to absolute segments (crate root = `[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    /// The module whose code names it.
    from: Vec<String>,
    /// The absolute path.
    path: Vec<String>,
    /// Inside a `#[cfg(test)]` module.
    test: bool,
}

fn is_ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The absolute form of `first` (`crate`, `self`, `super` or a `use`d alias) in module `here`.
fn root_of(
    first: &str,
    here: &[String],
    aliases: &BTreeMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    match first {
        "crate" => Some(Vec::new()),
        "self" => Some(here.to_vec()),
        "super" => Some(here[..here.len().saturating_sub(1)].to_vec()),
        a => aliases.get(a).cloned(),
    }
}

/// Parses a `use` tree at `toks[i..]` with prefix `prefix` (already absolute); pushes every
/// leaf path (with the name it binds) and returns the index after the tree.
fn use_tree(
    toks: &[Tok],
    mut i: usize,
    mut prefix: Vec<String>,
    here: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    loop {
        match toks.get(i) {
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, prefix.clone(), here, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                out.push((prefix, None));
                return i + 1;
            }
            Some(Tok::Ident(s)) => {
                match s.as_str() {
                    "self" if prefix.is_empty() && i > 0 && toks[i - 1] != Tok::Path => {
                        prefix = here.to_vec()
                    }
                    "self" => {}
                    "super" => {
                        prefix.pop();
                    }
                    "crate" => prefix.clear(),
                    _ => prefix.push(s.clone()),
                }
                let bound = if s == "self" {
                    prefix.last().cloned()
                } else {
                    Some(s.clone())
                };
                i += 1;
                if toks.get(i) == Some(&Tok::Path) {
                    i += 1;
                    continue;
                }
                let mut name = bound;
                if is_ident(toks.get(i)) == Some("as") {
                    name = is_ident(toks.get(i + 1)).map(str::to_owned);
                    i += 2;
                }
                out.push((prefix, name));
                return i;
            }
            _ => return i,
        }
    }
}

/// Module paths of the files under `root` (`plugin/transport/tcp/qp.rs` →
/// `[transport, tcp, qp]`; `mod.rs` and `lib.rs` name their directory).
fn file_module(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under plugin/");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = segs.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        segs.push(stem.to_owned());
    }
    segs
}

/// Every path the code of `src` (the file of module `file_mod`) names, resolved; inline
/// modules (`mod x { .. }`) are entered, `#[cfg(test)]` ones marked. Also returns the inline
/// modules found and the child modules declared `#[cfg(test)] mod x;`.
fn named_paths(
    src: &str,
    file_mod: &[String],
    test_file: bool,
) -> (Vec<Named>, Vec<Vec<String>>, Vec<Vec<String>>) {
    let toks = lex(src);
    let mut out = Vec::new();
    let mut inline = Vec::new();
    let mut test_children = Vec::new();
    // (module path, brace depth at which it closes, test)
    let mut stack: Vec<(Vec<String>, usize, bool)> = vec![(file_mod.to_vec(), 0, test_file)];
    let mut depth = 0usize;
    let mut aliases: Vec<BTreeMap<String, Vec<String>>> = vec![BTreeMap::new()];
    let mut cfg_test = false;
    let mut i = 0;
    while i < toks.len() {
        let (here, _, test) = stack.last().cloned().expect("root module");
        match &toks[i] {
            Tok::Punct('#') => {
                // `#[cfg(test)]`
                let attr: Vec<&Tok> = toks[i..].iter().take(6).collect();
                if attr.len() == 6
                    && attr[1] == &Tok::Punct('[')
                    && is_ident(Some(attr[2])) == Some("cfg")
                    && attr[3] == &Tok::Punct('(')
                    && is_ident(Some(attr[4])) == Some("test")
                    && attr[5] == &Tok::Punct(')')
                {
                    cfg_test = true;
                    i += 7;
                    continue;
                }
                i += 1;
                continue;
            }
            Tok::Ident(k) if k == "mod" => {
                if let Some(name) = is_ident(toks.get(i + 1)) {
                    let mut m = here.clone();
                    m.push(name.to_owned());
                    match toks.get(i + 2) {
                        Some(Tok::Punct('{')) => {
                            depth += 1;
                            inline.push(m.clone());
                            stack.push((m, depth, test || cfg_test));
                            aliases.push(BTreeMap::new());
                            cfg_test = false;
                            i += 3;
                            continue;
                        }
                        Some(Tok::Punct(';')) if cfg_test => test_children.push(m),
                        _ => {}
                    }
                }
            }
            Tok::Ident(k) if k == "use" => {
                let mut leaves = Vec::new();
                let first = is_ident(toks.get(i + 1)).unwrap_or("");
                let scope = aliases.last().expect("scope");
                if let Some(prefix) = root_of(first, &here, scope) {
                    let end = if matches!(first, "crate" | "self" | "super") {
                        // From the keyword itself, so that `super::super` resolves.
                        use_tree(&toks, i + 1, here.clone(), &here, &mut leaves)
                    } else if toks.get(i + 2) == Some(&Tok::Path) {
                        // An alias: the tree continues after `alias::`.
                        use_tree(&toks, i + 3, prefix, &here, &mut leaves)
                    } else {
                        i + 2
                    };
                    for (path, name) in leaves {
                        if let Some(n) = name {
                            aliases.last_mut().expect("scope").insert(n, path.clone());
                        }
                        out.push(Named {
                            from: here.clone(),
                            path,
                            test,
                        });
                    }
                    cfg_test = false;
                    i = end;
                    continue;
                }
            }
            Tok::Ident(first) => {
                let after_path = i > 0 && toks[i - 1] == Tok::Path;
                if !after_path && toks.get(i + 1) == Some(&Tok::Path) {
                    if let Some(mut path) = root_of(first, &here, aliases.last().expect("scope")) {
                        let mut j = i + 2;
                        while let Some(seg) = is_ident(toks.get(j)) {
                            match seg {
                                "super" => {
                                    path.pop();
                                }
                                "self" => {}
                                s => path.push(s.to_owned()),
                            }
                            if toks.get(j + 1) == Some(&Tok::Path) {
                                j += 2;
                            } else {
                                j += 1;
                                break;
                            }
                        }
                        out.push(Named {
                            from: here.clone(),
                            path,
                            test,
                        });
                        cfg_test = false;
                        i = j;
                        continue;
                    }
                }
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if stack.len() > 1 && stack.last().is_some_and(|s| s.1 == depth) {
                    stack.pop();
                    aliases.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Punct(';') => cfg_test = false,
            _ => {}
        }
        i += 1;
    }
    (out, inline, test_children)
}

// ------------------------------------------------------------------------------------------
// The graph.

/// One import between two modules: `from` and `to` are siblings (children of one parent).
#[derive(Clone, Debug)]
struct Edge {
    /// Where: `file: crate::a::b`.
    site: String,
    test: bool,
}

/// (from, to) sibling modules → the sites that make the edge.
type Graph = BTreeMap<(Vec<String>, Vec<String>), Vec<Edge>>;

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

/// The innermost known module `path` lies in (the crate root when none).
fn module_of(path: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// Turns resolved paths into sibling edges (containment skipped).
fn graph_of(named: &[(String, Named)], modules: &BTreeSet<Vec<String>>) -> Graph {
    let mut g: Graph = BTreeMap::new();
    for (file, n) in named {
        let to = module_of(&n.path, modules);
        let common = n.from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common == n.from.len() || common == to.len() {
            continue; // one contains the other
        }
        g.entry((n.from[..=common].to_vec(), to[..=common].to_vec()))
            .or_default()
            .push(Edge {
                site: format!("{file}: crate::{}", n.path.join("::")),
                test: n.test,
            });
    }
    g
}

/// The import graph of `plugin/`.
fn import_graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugin");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut modules: BTreeSet<Vec<String>> = files.iter().map(|f| file_module(&root, f)).collect();
    let mut test_mods: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut per_file = Vec::new();
    // Pass 1: which modules exist and which are tests.
    for f in &files {
        let src = std::fs::read_to_string(f).expect("read source");
        let m = file_module(&root, f);
        let (_, inline, tests) = named_paths(&src, &m, false);
        modules.extend(inline);
        test_mods.extend(tests);
        per_file.push((f.clone(), m, src));
    }
    // Pass 2: the paths, with test files marked.
    let mut named = Vec::new();
    for (f, m, src) in per_file {
        let test = test_mods.iter().any(|t| m.starts_with(t));
        let (paths, _, _) = named_paths(&src, &m, test);
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        named.extend(paths.into_iter().map(|n| (rel.clone(), n)));
    }
    graph_of(&named, &modules)
}

/// The edges between top-level modules, by name.
fn top_level(g: &Graph) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for ((from, to), sites) in g {
        if from.len() == 1 {
            out.entry((from[0].clone(), to[0].clone()))
                .or_default()
                .extend(sites.iter().map(|e| e.site.clone()));
        }
    }
    out
}

/// The first cycle among the non-test edges between children of one parent, per parent, with
/// the site of each of its edges.
fn cycles(g: &Graph) -> Vec<String> {
    let mut next: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = BTreeMap::new();
    for ((from, to), sites) in g {
        if sites.iter().any(|e| !e.test) {
            next.entry(from).or_default().insert(to);
        }
    }
    fn visit<'a>(
        n: &'a Vec<String>,
        next: &BTreeMap<&'a Vec<String>, BTreeSet<&'a Vec<String>>>,
        stack: &mut Vec<&'a Vec<String>>,
        done: &mut BTreeSet<&'a Vec<String>>,
    ) -> Option<Vec<&'a Vec<String>>> {
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
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for &n in next.keys() {
        if let Some(cycle) = visit(n, &next, &mut Vec::new(), &mut done) {
            // Report each cycle once, whichever of its modules the search started from.
            done.extend(cycle.iter().copied());
            let name = |m: &Vec<String>| m.join("::");
            let sites: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let s = &g[&(w[0].clone(), w[1].clone())];
                    let e = s.iter().find(|e| !e.test).expect("non-test edge");
                    format!("  {} -> {}: {}", name(w[0]), name(w[1]), e.site)
                })
                .collect();
            let names: Vec<String> = cycle.iter().map(|m| name(m)).collect();
            found.push(format!(
                "import cycle {}:\n{}",
                names.join(" -> "),
                sites.join("\n")
            ));
        }
    }
    found
}

// ------------------------------------------------------------------------------------------
// The checks.

#[test]
fn modules_import_only_downwards() {
    let mut wrong = Vec::new();
    for ((from, to), sites) in top_level(&import_graph()) {
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
    for ((from, to), sites) in top_level(&import_graph()) {
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
fn there_are_no_import_cycles_at_any_level() {
    let found = cycles(&import_graph());
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The graph sees the imports inside `transport` that a `crate::`-only reader missed (through
/// `super::`, `self::` and multi-line `use` trees), so the cycle check has something to check.
#[test]
fn the_graph_sees_imports_between_submodules() {
    let g = import_graph();
    let has = |from: &str, to: &str| {
        let f: Vec<String> = from.split("::").map(str::to_owned).collect();
        let t: Vec<String> = to.split("::").map(str::to_owned).collect();
        g.contains_key(&(f, t))
    };
    for (from, to) in [
        ("transport::ib::qp", "transport::ib::context"),
        ("transport::ib::device", "transport::ib::qp"),
        ("transport::tcp::qp", "transport::tcp::registry"),
        ("transport::tcp::qp", "transport::tcp::wire"),
        ("transport::conformance", "transport::tcp"),
    ] {
        assert!(has(from, to), "no edge {from} -> {to}");
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

#[test]
fn the_path_reader_sees_imports_and_skips_comments_and_strings() {
    let src = "use crate::transport::{SendWr, Wc};\n// crate::ffi in a comment\n\
               let x = crate::engine::wire::MAX; // crate::api\n\
               let y = \"crate::conn in a string\"; /* crate::net */ let c = '\\'';\n\
               fn f<'a>(x: &'a u8) -> crate::mem::Region { todo!() }\n";
    let (paths, _, _) = named_paths(src, &s(&["comm"]), false);
    let got: Vec<Vec<String>> = paths.into_iter().map(|n| n.path).collect();
    assert_eq!(
        got,
        vec![
            s(&["transport", "SendWr"]),
            s(&["transport", "Wc"]),
            s(&["engine", "wire", "MAX"]),
            s(&["mem", "Region"]),
        ]
    );
}

#[test]
fn the_path_reader_resolves_super_self_nested_trees_and_aliases() {
    let src = "use super::context::{\n    PortInfo,\n    ProtectionDomain,\n};\n\
               use super::super::{self, tcp::{wire::Frame, qp}};\n\
               use self::inner::Thing;\n\
               fn g() { transport::Kind::Ib; qp::TcpQp::new(); super::dl::verbs(); }\n\
               #[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::config::Config;\n}\n\
               mod inner { use super::dl::Verbs; }\n";
    let here = s(&["transport", "ib", "qp"]);
    let (paths, inline, _) = named_paths(src, &here, false);
    let got: Vec<(Vec<String>, Vec<String>, bool)> = paths
        .into_iter()
        .map(|n| (n.from, n.path, n.test))
        .collect();
    let q = here.clone();
    let t = {
        let mut t = here.clone();
        t.push("tests".into());
        t
    };
    let inner = {
        let mut t = here.clone();
        t.push("inner".into());
        t
    };
    assert_eq!(
        got,
        vec![
            (
                q.clone(),
                s(&["transport", "ib", "context", "PortInfo"]),
                false
            ),
            (
                q.clone(),
                s(&["transport", "ib", "context", "ProtectionDomain"]),
                false
            ),
            (q.clone(), s(&["transport"]), false),
            (q.clone(), s(&["transport", "tcp", "wire", "Frame"]), false),
            (q.clone(), s(&["transport", "tcp", "qp"]), false),
            (
                q.clone(),
                s(&["transport", "ib", "qp", "inner", "Thing"]),
                false
            ),
            (q.clone(), s(&["transport", "Kind", "Ib"]), false),
            (
                q.clone(),
                s(&["transport", "tcp", "qp", "TcpQp", "new"]),
                false
            ),
            (q.clone(), s(&["transport", "ib", "dl", "verbs"]), false),
            (t.clone(), s(&["transport", "ib", "qp"]), true),
            (t, s(&["config", "Config"]), true),
            (inner, s(&["transport", "ib", "qp", "dl", "Verbs"]), false),
        ]
    );
    assert_eq!(
        inline,
        vec![
            s(&["transport", "ib", "qp", "tests"]),
            s(&["transport", "ib", "qp", "inner"])
        ]
    );
}

/// A cycle between two siblings is found with its sites; containment (a child using its
/// parent, the parent using the child) and test-only edges are not cycles.
#[test]
fn the_cycle_check_finds_a_sibling_cycle_and_ignores_containment_and_tests() {
    let modules: BTreeSet<Vec<String>> = [
        s(&["t"]),
        s(&["t", "a"]),
        s(&["t", "b"]),
        s(&["t", "c"]),
        s(&["t", "c", "tests"]),
    ]
    .into_iter()
    .collect();
    let named = |from: &[&str], path: &[&str], test: bool| {
        (
            format!("{}.rs", from.join("/")),
            Named {
                from: s(from),
                path: s(path),
                test,
            },
        )
    };
    let base = vec![
        named(&["t", "a"], &["t", "Shared"], false),
        named(&["t"], &["t", "a", "A"], false),
        named(&["t", "a"], &["t", "b", "B"], false),
        named(&["t", "c", "tests"], &["t", "a", "A"], true),
        named(&["t", "a"], &["t", "c", "C"], false),
    ];
    assert!(cycles(&graph_of(&base, &modules)).is_empty());
    let mut with_cycle = base.clone();
    with_cycle.push(named(&["t", "b"], &["t", "a", "helper"], false));
    let found = cycles(&graph_of(&with_cycle, &modules));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("t::a -> t::b -> t::a"), "{}", found[0]);
    assert!(
        found[0].contains("t/b.rs: crate::t::a::helper"),
        "{}",
        found[0]
    );
}
