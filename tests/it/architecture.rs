//! The rules doc/architecture.md states, checked against the sources.
//!
//! The test reads the document's tables and the non-test code of the library and of the
//! protocol crate it re-exports as `fuse` (every module reached from `src/lib.rs` and
//! `crates/fuse/src/lib.rs`, without `#[cfg(test)]` items; comments and string literals
//! ignored), and checks that:
//! - each layer uses only the modules its "may use" cell names, and nothing its "never uses"
//!   cell names ("Layers and the rule each boundary keeps");
//! - inside `passthrough/`, each module uses only modules of the rows below its own, and
//!   `mod.rs` calls no method of the rows above it; its module documentation names every
//!   module;
//! - inside every folder, no modules use one another in a circle;
//! - every path the document names ("Where to find things" and elsewhere) exists;
//! - the node's unsafe code stays in its slab (`src/passthrough/node/slab.rs`);
//! - lints are declared once, in the workspace's Cargo.toml, which every member takes, not
//!   repeated as `#![deny]`/`#![warn]` attributes.
//!
//! A module "uses" another when its code names a path into it: `crate::a::b`, `super::b`, a
//! child module by name, or a glob `use super::*`.
//!
//! What Cargo keeps is not checked here: the protocol crate, the test frontend and the
//! benchmark do not depend on the daemon's library, so they cannot name it, and the protocol
//! crate depends on no virtio crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn exists(rel: &str) -> bool {
    Path::new(ROOT).join(rel).exists()
}

// ---------------------------------------------------------------------------------------------
// Reading Rust sources
// ---------------------------------------------------------------------------------------------

/// `src` with comments, string, byte-string, C-string and character literals blanked out
/// (newlines kept, so line numbers stay), so that what is left is code.
fn blank(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    // Blanks c[from..to] into `out`.
    let put_blank = |out: &mut String, from: usize, to: usize| {
        for &ch in &c[from..to.min(c.len())] {
            out.push(if ch == '\n' { '\n' } else { ' ' });
        }
    };
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
            put_blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            put_blank(&mut out, i, j);
            i = j;
        } else if c[i] == 'r'
            && (i == 0
                || !ident(c[i - 1])
                || ("bc".contains(c[i - 1]) && (i == 1 || !ident(c[i - 2]))))
            && matches!(next, Some('"' | '#'))
            && {
                let h = (i + 1..c.len()).take_while(|&j| c[j] == '#').count();
                c.get(i + 1 + h) == Some(&'"')
            }
        {
            // A raw string: r"…", r#"…"#, br"…", cr"…".
            let hashes = (i + 1..c.len()).take_while(|&j| c[j] == '#').count();
            let mut j = i + 2 + hashes;
            while j < c.len() {
                if c[j] == '"' && (j + 1..j + 1 + hashes).all(|k| c.get(k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            put_blank(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            put_blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\''), or else a lifetime or label.
            let end = if next == Some('\\') {
                (i + 3..c.len()).find(|&j| c[j] == '\'').map(|j| j + 1)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(e) => {
                    put_blank(&mut out, i, e);
                    i = e;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// `code` (blanked) without the items marked `#[cfg(test)]`.
fn strip_test_items(code: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(at) = out[from..].find(ATTR).map(|p| p + from) {
        let bytes = out.as_bytes();
        let (mut depth, mut end) = (0usize, bytes.len());
        for (j, &b) in bytes.iter().enumerate().skip(at + ATTR.len()) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
        }
        let blanked: String = out[at..end]
            .chars()
            .map(|ch| if ch == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(at..end, &blanked);
        from = at + blanked.len();
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of blanked code, each with its line.
fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let (mut out, mut line, mut i) = (Vec::new(), 1, 0);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// A path named in the code: its segments (`*` for a glob), its line, and whether a call
/// follows it (`libc::open(`).
#[derive(Debug)]
struct PathRef {
    segs: Vec<String>,
    line: usize,
    called: bool,
    /// Named by a `pub use`: a re-export.
    reexport: bool,
}

/// Every path the tokens name, `use` groups expanded (`a::{b, c::d}` gives `a::b`, `a::c::d`).
fn paths(toks: &[(Tok, usize)]) -> Vec<PathRef> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(toks[i].0, Tok::Ident(_))
            && !(i > 0 && matches!(toks[i - 1].0, Tok::Sep | Tok::Punct('.')));
        if !starts {
            i += 1;
            continue;
        }
        let line = toks[i].1;
        // `pub use`, `pub(crate) use`: the token before `use` is `pub` or a `)`.
        let reexport = i >= 2
            && toks[i - 1].0 == Tok::Ident("use".into())
            && (toks[i - 2].0 == Tok::Ident("pub".into()) || toks[i - 2].0 == Tok::Punct(')'));
        let mut found = Vec::new();
        i = path_at(toks, i, Vec::new(), &mut found);
        let called = matches!(toks.get(i), Some((Tok::Punct('('), _)));
        for segs in found {
            out.push(PathRef {
                segs,
                line,
                called,
                reexport,
            });
        }
    }
    out
}

/// Reads the path starting at `i` (after `prefix`) into `found`; returns the index after it.
fn path_at(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: Vec<String>,
    found: &mut Vec<Vec<String>>,
) -> usize {
    let mut segs = prefix;
    loop {
        match toks.get(i) {
            Some((Tok::Ident(s), _)) => {
                segs.push(s.clone());
                i += 1;
            }
            Some((Tok::Punct('*'), _)) => {
                segs.push("*".into());
                i += 1;
            }
            Some((Tok::Punct('{'), _)) => {
                // A group: paths separated by commas, up to the closing brace.
                i += 1;
                loop {
                    match toks.get(i) {
                        Some((Tok::Punct('}'), _)) | None => return i + 1,
                        Some((Tok::Punct(','), _)) => i += 1,
                        Some((Tok::Ident(s), _)) if s == "as" => i += 2,
                        _ => {
                            let before = i;
                            i = path_at(toks, i, segs.clone(), found);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            _ => break,
        }
        if matches!(toks.get(i), Some((Tok::Sep, _))) {
            i += 1;
        } else {
            break;
        }
    }
    if !segs.is_empty() {
        found.push(segs);
    }
    i
}

/// The protocol crate (`crates/fuse`, `virtiofs_fuse`): the daemon's library re-exports it as
/// its module `fuse` (`pub use virtiofs_fuse as fuse;`) and some of its modules under their
/// own names (`pub use virtiofs_fuse::filesystem;`). The test reads it as that module: its
/// `crate::server` is the daemon's `fuse::server`, its `filesystem` the daemon's `filesystem`.
const PROTOCOL: &str = "fuse";
const PROTOCOL_CRATE: &str = "virtiofs_fuse";
const PROTOCOL_SRC: &str = "crates/fuse/src/";

/// A module of the library, or of the protocol crate, as compiled without tests.
struct Module {
    /// `["passthrough", "identity"]`; empty for the crate root; `["fuse", "server"]` for the
    /// protocol crate's `server`.
    path: Vec<String>,
    /// What `crate::` names in it: empty in the daemon, `["fuse"]` in the protocol crate.
    root: Vec<String>,
    /// `src/passthrough/identity.rs`.
    file: String,
    /// The source as written.
    text: String,
    /// Its code: blanked, test items removed.
    code: String,
    /// Its child modules declared outside `#[cfg(test)]`.
    children: Vec<String>,
}

/// The modules of the protocol crate the daemon's library re-exports under their own name
/// (`pub use virtiofs_fuse::filesystem;`): `filesystem` → `["fuse", "filesystem"]`.
fn protocol_aliases() -> BTreeMap<String, Vec<String>> {
    let lib = blank(&read("src/lib.rs"));
    assert!(
        lib.contains(&format!("pub use {PROTOCOL_CRATE} as {PROTOCOL};")),
        "src/lib.rs no longer re-exports the protocol crate as `{PROTOCOL}`"
    );
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        if let Some(name) = line
            .trim()
            .strip_prefix(&format!("pub use {PROTOCOL_CRATE}::"))
            .and_then(|r| r.strip_suffix(';'))
        {
            out.insert(
                name.to_string(),
                vec![PROTOCOL.to_string(), name.to_string()],
            );
        }
    }
    out
}

/// A path into the daemon's library, with the protocol crate's modules under the name the
/// library gives them: `["filesystem", "Entry"]` → `["fuse", "filesystem", "Entry"]`.
fn canonical(mut a: Vec<String>, aliases: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    if let Some(to) = a.first().and_then(|f| aliases.get(f)) {
        let mut c = to.clone();
        c.extend(a.drain(1..));
        return c;
    }
    a
}

/// Every module reached from `src/lib.rs`, and from the protocol crate's
/// `crates/fuse/src/lib.rs`, through `mod` declarations not marked `#[cfg(test)]`.
fn modules() -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![
        (Vec::<String>::new(), "src/lib.rs".to_string()),
        (vec![PROTOCOL.to_string()], format!("{PROTOCOL_SRC}lib.rs")),
    ];
    while let Some((path, file)) = todo.pop() {
        let root = if file.starts_with(PROTOCOL_SRC) {
            vec![PROTOCOL.to_string()]
        } else {
            Vec::new()
        };
        let text = read(&file);
        let code = strip_test_items(&blank(&text));
        let toks = tokens(&code);
        let mut children = Vec::new();
        for w in toks.windows(3) {
            if let [(Tok::Ident(m), _), (Tok::Ident(name), _), (Tok::Punct(';'), _)] = w {
                if m == "mod" {
                    children.push(name.clone());
                }
            }
        }
        let dir = match file.strip_suffix("mod.rs").or(file.strip_suffix("lib.rs")) {
            Some(d) => d.to_string(),
            None => format!("{}/", file.trim_end_matches(".rs")),
        };
        for child in &children {
            let flat = format!("{dir}{child}.rs");
            let nested = format!("{dir}{child}/mod.rs");
            let f = if exists(&flat) { flat } else { nested };
            assert!(exists(&f), "module {child} of {file}: no {f}");
            let mut p = path.clone();
            p.push(child.clone());
            todo.push((p, f));
        }
        out.push(Module {
            path,
            root,
            file,
            text,
            code,
            children,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// A use of a module of the crate, or of another crate.
#[derive(Debug)]
struct Use {
    /// The module of the crate named (`["fuse", "abi"]`), when the path leads into the crate.
    module: Option<Vec<String>>,
    /// The first segment, for a path into another crate (`libc`, `nix`, `vhost`).
    external: Option<String>,
    /// A call of a function of `libc` (`libc::open(`).
    libc_call: bool,
    /// A re-export (`pub use`).
    reexport: bool,
    line: usize,
}

/// What each path of module `m` leads to.
fn uses(m: &Module, all: &BTreeSet<Vec<String>>) -> Vec<Use> {
    let toks = tokens(&m.code);
    let aliases = protocol_aliases();
    let mut out = Vec::new();
    for p in paths(&toks) {
        let s = &p.segs;
        let abs: Option<Vec<String>> = match s[0].as_str() {
            "crate" => {
                let mut a = m.root.clone();
                a.extend_from_slice(&s[1..]);
                Some(a)
            }
            // The protocol crate by its own name is the daemon's module `fuse`.
            first if first == PROTOCOL_CRATE => {
                let mut a = vec![PROTOCOL.to_string()];
                a.extend_from_slice(&s[1..]);
                Some(a)
            }
            // `pub(super)` is no path.
            "super" if s.len() > 1 => {
                let ups = s.iter().take_while(|x| *x == "super").count();
                if ups > m.path.len() {
                    None
                } else {
                    let mut a = m.path[..m.path.len() - ups].to_vec();
                    a.extend_from_slice(&s[ups..]);
                    Some(a)
                }
            }
            "self" if s.len() > 1 => {
                let mut a = m.path.clone();
                a.extend_from_slice(&s[1..]);
                Some(a)
            }
            first if s.len() > 1 && m.children.iter().any(|c| c == first) => {
                let mut a = m.path.clone();
                a.extend_from_slice(s);
                Some(a)
            }
            _ => None,
        };
        match abs.map(|a| canonical(a, &aliases)) {
            Some(a) => {
                // The longest prefix that is a module: the path names it or an item of it.
                let module = (0..=a.len())
                    .rev()
                    .map(|n| a[..n].to_vec())
                    .find(|prefix| all.contains(prefix));
                // The root of a crate (its `lib.rs`: declarations, a macro) is no layer.
                let module = module.filter(|x| !x.is_empty() && *x != m.path && *x != m.root);
                if let Some(module) = module {
                    out.push(Use {
                        module: Some(module),
                        external: None,
                        libc_call: false,
                        reexport: p.reexport,
                        line: p.line,
                    });
                }
            }
            None if s.len() > 1 && !matches!(s[0].as_str(), "self" | "Self" | "super") => {
                out.push(Use {
                    module: None,
                    external: Some(s[0].clone()),
                    libc_call: s[0] == "libc" && p.called && s.len() == 2,
                    reexport: p.reexport,
                    line: p.line,
                });
            }
            None => {}
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Reading the document
// ---------------------------------------------------------------------------------------------

const DOC: &str = "doc/architecture.md";

/// The rows of the first table after the line that contains `marker`, each split into cells.
fn table_after(doc: &str, marker: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(marker)
        .unwrap_or_else(|| panic!("{DOC}: no '{marker}'"));
    let rows: Vec<Vec<String>> = doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    assert!(rows.len() > 2, "{DOC}: no table after '{marker}'");
    // Without the header and the `---` line.
    rows[2..].to_vec()
}

/// The `backticked` parts of `text`.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// `text` without what stands in parentheses.
fn outside_parens(text: &str) -> String {
    let mut depth = 0;
    text.chars()
        .filter(|&ch| {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => return depth == 0,
            }
            false
        })
        .collect()
}

/// Splits `text` at the commas that stand outside parentheses.
fn items(text: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for ch in text.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur.trim().to_string());
    out.retain(|s| !s.is_empty());
    out
}

/// The crates this package depends on, by the name code uses (`vm_memory`), and `std`.
fn crates() -> BTreeSet<String> {
    let toml = read("Cargo.toml");
    let mut out = BTreeSet::from(["std".to_string()]);
    let mut inside = false;
    for line in toml.lines() {
        if line.starts_with('[') {
            inside = line.trim() == "[dependencies]";
        } else if inside && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                out.insert(name.trim().replace('-', "_"));
            }
        }
    }
    out
}

/// The crates of "virtio types".
const VIRTIO_CRATES: &[&str] = &[
    "vhost",
    "vhost_user_backend",
    "virtio_queue",
    "virtio_bindings",
    "vm_memory",
    "vmm_sys_util",
];

/// One thing a layer never uses.
#[derive(Debug)]
enum Never {
    /// A module of the crate, and everything in it.
    Module(Vec<String>),
    /// Another crate.
    Crate(String),
    /// Calls of `libc` functions, and `nix`.
    HostSyscalls,
    /// Every module of the crate but these.
    AllModulesBut(Vec<Vec<String>>),
}

/// A row of the layer table.
#[derive(Debug)]
struct Layer {
    /// The files and folders it holds (`src/idmap/`, `src/daemon.rs`, `crates/fuse/src/io.rs`).
    holds: Vec<String>,
    /// The modules it may use (prefixes); `None`: any.
    may_use: Option<Vec<Vec<String>>>,
    /// What it never uses, with the files of the layer each rule spares (`io.rs`).
    never: Vec<(Never, Vec<String>)>,
    is_leaves: bool,
}

fn segs(path: &str) -> Vec<String> {
    path.split("::").map(str::to_string).collect()
}

/// The layer table; `modules` are the names of the crate's modules.
fn layers(doc: &str, modules: &BTreeSet<Vec<String>>) -> Vec<Layer> {
    let crates = crates();
    let aliases = protocol_aliases();
    let seg = |p: &str| canonical(segs(p), &aliases);
    let rows = table_after(doc, "## Layers and the rule each boundary keeps");
    let leaves_row = rows
        .iter()
        .find(|r| r[0].starts_with("the leaves"))
        .expect("a row of leaves");
    let leaves: Vec<Vec<String>> = backticked(&leaves_row[0])
        .iter()
        .filter(|b| b.starts_with("src/"))
        .map(|f| module_of_file(f))
        .collect();
    let known = |name: &str, what: &str| {
        assert!(
            modules.contains(&seg(name)) || crates.contains(&name.replace('-', "_")),
            "{DOC}: `{name}` in {what} is neither a module of the crate nor a crate it uses"
        );
    };
    rows.iter()
        .map(|r| {
            assert_eq!(r.len(), 4, "{DOC}: layer row {r:?}");
            let holds: Vec<String> = backticked(&r[0])
                .into_iter()
                .filter(|b| b.starts_with("src/") || b.starts_with(PROTOCOL_SRC))
                .collect();
            let may = outside_parens(&r[2]);
            let may_use = if may.trim() == "everything" {
                None
            } else {
                let mut v = Vec::new();
                for b in backticked(&may) {
                    known(&b, "a \"may use\" cell");
                    if modules.contains(&seg(&b)) {
                        v.push(seg(&b));
                    }
                }
                if may.contains("the leaves") {
                    v.extend(leaves.iter().cloned());
                }
                Some(v)
            };
            let mut never = Vec::new();
            for item in items(&r[3]) {
                let spared: Vec<String> = match item.split_once("but in ") {
                    Some((_, rest)) => backticked(rest),
                    None => Vec::new(),
                };
                let head = outside_parens(item.split("but in ").next().unwrap_or(""));
                let head = head.trim();
                let rule = if head == "—" {
                    continue;
                } else if head == "virtio types" {
                    for c in VIRTIO_CRATES {
                        never.push((Never::Crate(c.to_string()), spared.clone()));
                    }
                    Never::Module(seg("vhost_user"))
                } else if head == "host syscalls" {
                    Never::HostSyscalls
                } else if head == "the filesystem layers" {
                    for m in ["filesystem", "fuse", "idmap"] {
                        never.push((Never::Module(seg(m)), spared.clone()));
                    }
                    Never::Module(seg("passthrough"))
                } else if head == "any other module of the crate" {
                    Never::AllModulesBut(Vec::new())
                } else if head == "any other module of the daemon" {
                    // The protocol crate's modules are its "may use" cell's business.
                    Never::AllModulesBut(vec![seg(PROTOCOL)])
                } else if let [one] = backticked(head).as_slice() {
                    known(one, "a \"never uses\" cell");
                    if modules.contains(&seg(one)) {
                        Never::Module(seg(one))
                    } else {
                        Never::Crate(one.replace('-', "_"))
                    }
                } else {
                    panic!("{DOC}: \"never uses\": '{head}' is no rule this test knows");
                };
                never.push((rule, spared));
            }
            Layer {
                holds,
                may_use,
                never,
                is_leaves: std::ptr::eq(r, leaves_row),
            }
        })
        .collect()
}

/// The module a file of the table names: `src/idmap/` is `idmap`, `src/os.rs` is `os`,
/// `crates/fuse/src/server.rs` is `fuse::server`.
fn module_of_file(f: &str) -> Vec<String> {
    if let Some(rest) = f.strip_prefix(PROTOCOL_SRC) {
        let mut m = vec![PROTOCOL.to_string()];
        m.extend(module_of_file(&format!("src/{rest}")));
        return m;
    }
    let p = f
        .trim_start_matches("src/")
        .trim_end_matches('/')
        .trim_end_matches(".rs")
        .trim_end_matches("/mod");
    p.split('/').map(str::to_string).collect()
}

/// Whether module `m` is `prefix` or inside it.
fn within(m: &[String], prefix: &[String]) -> bool {
    m.len() >= prefix.len() && m[..prefix.len()] == *prefix
}

// ---------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------

#[test]
fn layers_use_only_what_the_layer_table_allows() {
    let doc = read(DOC);
    let mods = modules();
    let names: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let layers = layers(&doc, &names);
    let mut broken = Vec::new();
    for m in mods.iter().filter(|m| m.path != m.root) {
        let holders: Vec<&Layer> = layers
            .iter()
            .filter(|l| l.holds.iter().any(|h| within(&m.path, &module_of_file(h))))
            .collect();
        let [layer] = holders.as_slice() else {
            broken.push(format!(
                "{}: in {} rows of the layer table, not one",
                m.file,
                holders.len()
            ));
            continue;
        };
        // A leaf is a layer of its own: the leaves do not use one another either.
        let own: Vec<Vec<String>> = if layer.is_leaves {
            vec![m.path[..1].to_vec()]
        } else {
            layer.holds.iter().map(|h| module_of_file(h)).collect()
        };
        let file_name = m.file.rsplit('/').next().unwrap_or_default();
        for u in uses(m, &names) {
            let at = format!("{}:{}", m.file, u.line);
            if let Some(target) = &u.module {
                if own.iter().any(|o| within(target, o)) {
                    continue;
                }
                let t = target.join("::");
                if let Some(may) = &layer.may_use {
                    if !may.iter().any(|p| within(target, p)) {
                        broken.push(format!(
                            "{at}: uses `{t}`, which its \"may use\" cell does not name"
                        ));
                    }
                }
                for (rule, spared) in &layer.never {
                    if spared.iter().any(|s| s == file_name) {
                        continue;
                    }
                    let hit = match rule {
                        Never::Module(p) => within(target, p),
                        Never::AllModulesBut(but) => !but.iter().any(|p| within(target, p)),
                        _ => false,
                    };
                    if hit {
                        broken.push(format!("{at}: uses `{t}`, which it never uses ({rule:?})"));
                    }
                }
            }
            if let Some(krate) = &u.external {
                for (rule, spared) in &layer.never {
                    if spared.iter().any(|s| s == file_name) {
                        continue;
                    }
                    let hit = match rule {
                        Never::Crate(c) => c == krate,
                        Never::HostSyscalls => krate == "nix" || u.libc_call,
                        _ => false,
                    };
                    if hit {
                        broken.push(format!(
                            "{at}: uses `{krate}`, which it never uses ({rule:?})"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{DOC} does not hold:\n{}",
        broken.join("\n")
    );
}

/// The transport asks for what a state load needs through a trait of its own, which the daemon
/// implements: the table keeps it from the sandbox, and no longer lets it use any of it.
#[test]
fn the_transport_never_uses_the_sandbox() {
    let doc = read(DOC);
    let rows = table_after(&doc, "## Layers and the rule each boundary keeps");
    let row = rows
        .iter()
        .find(|r| r[0].starts_with("`src/vhost_user/`"))
        .expect("the transport's row of the layer table");
    assert!(
        items(&row[3]).iter().any(|i| i == "`sandbox`"),
        "{DOC}: the transport's \"never uses\" cell must name `sandbox`: {:?}",
        row[3]
    );
    assert!(
        !backticked(&row[2]).iter().any(|b| b.starts_with("sandbox")),
        "{DOC}: the transport's \"may use\" cell names the sandbox: {:?}",
        row[2]
    );
}

#[test]
fn passthrough_modules_use_only_the_rows_below_their_own() {
    let doc = read(DOC);
    let mods = modules();
    let names: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let rows = table_after(&doc, "Inside `passthrough/`");
    let mut row_of: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        for f in backticked(&r[1]) {
            let m = module_of_file(&format!("passthrough/{f}"));
            assert!(
                names.contains(&m),
                "{DOC}: passthrough row {}: no module `{f}`",
                i + 1
            );
            assert!(
                row_of.insert(m, i + 1).is_none(),
                "{DOC}: `{f}` is in two rows"
            );
        }
    }
    let pt = segs("passthrough");
    let inside: Vec<&Module> = mods.iter().filter(|m| within(&m.path, &pt)).collect();
    let mut broken = Vec::new();
    for m in &inside {
        let Some(&row) = row_of.get(&m.path) else {
            broken.push(format!("{}: in no row of the passthrough table", m.file));
            continue;
        };
        for u in uses(m, &names) {
            let Some(target) = u.module.filter(|t| within(t, &pt)) else {
                continue;
            };
            let below = row_of.get(&target).is_some_and(|&r| r > row);
            if !below {
                broken.push(format!(
                    "{}:{}: row {row} uses `{}`, which is not in a row below",
                    m.file,
                    u.line,
                    target.join("::")
                ));
            }
        }
    }
    // mod.rs calls none of the methods the files of the rows above define.
    let top = inside
        .iter()
        .find(|m| m.path == pt)
        .expect("passthrough/mod.rs");
    let defined = |m: &Module| -> BTreeSet<String> {
        let toks = tokens(&m.code);
        toks.windows(2)
            .filter_map(|w| match w {
                [(Tok::Ident(f), _), (Tok::Ident(name), _)] if f == "fn" => Some(name.clone()),
                _ => None,
            })
            .collect()
    };
    let own = defined(top);
    let top_row = row_of[&pt];
    for m in inside
        .iter()
        .filter(|m| row_of.get(&m.path).is_some_and(|&r| r < top_row))
    {
        let toks = tokens(&top.code);
        for name in defined(m).difference(&own) {
            for w in toks.windows(4) {
                if let [(Tok::Ident(s), line), (Tok::Punct('.'), _), (Tok::Ident(n), _), (Tok::Punct('('), _)] =
                    w
                {
                    if s == "self" && n == name {
                        broken.push(format!(
                            "{}:{line}: calls `{name}` of {}, a row above",
                            top.file, m.file
                        ));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{DOC} does not hold:\n{}",
        broken.join("\n")
    );
}

#[test]
fn passthrough_module_documentation_names_every_module() {
    let mods = modules();
    let top = mods
        .iter()
        .find(|m| m.path == segs("passthrough"))
        .expect("passthrough/mod.rs");
    let doc: String = top
        .text
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let named: BTreeSet<String> = backticked(&doc).into_iter().collect();
    let missing: Vec<&String> = top
        .children
        .iter()
        .filter(|c| !named.contains(*c))
        .collect();
    assert!(
        missing.is_empty(),
        "{}: its layout does not name {missing:?}",
        top.file
    );
}

#[test]
fn no_two_modules_of_a_folder_use_each_other() {
    let mods = modules();
    let names: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    // Uses between modules of the same top-level folder; a `mod.rs` re-exporting what its
    // modules define (`pub use`) names it, and does not use it.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for m in mods.iter().filter(|m| !m.path.is_empty()) {
        let e = edges.entry(m.path.clone()).or_default();
        for u in uses(m, &names) {
            if let Some(t) = u.module.filter(|t| t[0] == m.path[0] && !u.reexport) {
                e.insert(t);
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit(
        n: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let from = stack.iter().position(|x| x == n).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(n.clone());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for t in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(t, edges, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if let Some(cycle) = visit(n, &edges, &mut state, &mut Vec::new()) {
            let shown: Vec<String> = cycle.iter().map(|c| c.join("::")).collect();
            panic!("modules use one another in a circle: {}", shown.join(" → "));
        }
    }
}

#[test]
fn raw_libc_calls_stay_in_the_files_the_document_lists() {
    let doc = read(DOC);
    let listed: BTreeSet<String> = table_after(&doc, "**System calls.**")
        .iter()
        .flat_map(|r| backticked(&r[0]))
        .filter(|b| b.starts_with("src/") || b.starts_with(PROTOCOL_SRC))
        .collect();
    let mods = modules();
    let names: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let calling: BTreeSet<String> = mods
        .iter()
        .filter(|m| uses(m, &names).iter().any(|u| u.libc_call))
        .map(|m| m.file.clone())
        .collect();
    let unlisted: Vec<&String> = calling.difference(&listed).collect();
    let stale: Vec<&String> = listed.difference(&calling).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "{DOC}, System calls: raw libc calls in files it does not list: {unlisted:?}; listed \
         files without any: {stale:?}"
    );
}

/// "The node's unsafe code is in `src/passthrough/node/slab.rs` alone": no other file of the
/// node's folder has an `unsafe` block or `unsafe fn` outside its tests, but the files of the
/// system calls table (their raw calls). An `unsafe impl` of the slab's contract is allowed.
#[test]
fn the_node_s_unsafe_code_stays_in_the_slab() {
    let doc = read(DOC);
    assert!(
        doc.contains("**The node's unsafe code** is in `src/passthrough/node/slab.rs` alone"),
        "{DOC}: the paragraph on the node's unsafe code"
    );
    let raw_calls: BTreeSet<String> = table_after(&doc, "**System calls.**")
        .iter()
        .flat_map(|r| backticked(&r[0]))
        .collect();
    let mut broken = Vec::new();
    let mut seen = 0;
    for m in modules()
        .iter()
        .filter(|m| within(&m.path, &segs("passthrough::node")))
    {
        seen += 1;
        if m.file.ends_with("/slab.rs") || raw_calls.contains(&m.file) {
            continue;
        }
        for w in tokens(&m.code).windows(2) {
            if let [(Tok::Ident(u), line), (next, _)] = w {
                let fn_or_block =
                    matches!(next, Tok::Punct('{')) || *next == Tok::Ident("fn".into());
                if u == "unsafe" && fn_or_block {
                    broken.push(format!("{}:{line}", m.file));
                }
            }
        }
    }
    assert!(seen >= 4, "src/passthrough/node/: {seen} modules");
    assert!(
        broken.is_empty(),
        "unsafe code in the node's folder outside slab.rs: {broken:?}"
    );
}

#[test]
fn every_path_the_document_names_exists() {
    let doc = read(DOC);
    let mut missing = Vec::new();
    // The table: a bare file name stands in the folder of the path before it in its cell.
    for row in table_after(&doc, "## Where to find things") {
        let mut dir = String::new();
        for b in backticked(&row[1]) {
            let is_path = b.contains('/') || b.ends_with(".rs") || b.ends_with(".sh");
            if !is_path || b.contains('*') {
                continue;
            }
            let p = if b.contains('/') {
                b.clone()
            } else {
                format!("{dir}{b}")
            };
            dir = match p.rfind('/') {
                Some(i) => p[..=i].to_string(),
                None => String::new(),
            };
            if !exists(&p) {
                missing.push(p);
            }
        }
    }
    // Paths named anywhere else.
    for b in backticked(&doc) {
        let rooted = ["src/", "tests/", "doc/", "packaging/", "crates/"]
            .iter()
            .any(|r| b.starts_with(r));
        if rooted && !b.contains('*') && !b.contains(' ') && !exists(&b) {
            missing.push(b);
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "{DOC} names paths that do not exist: {missing:?}"
    );
}

#[test]
fn lints_are_declared_once_in_cargo_toml() {
    let toml = read("Cargo.toml");
    assert!(
        toml.contains("[workspace.lints.rust]") && toml.contains("[workspace.lints.clippy]"),
        "Cargo.toml declares no [workspace.lints]"
    );
    // Every member of `[workspace] members = [...]`, the root's "." included.
    let members: Vec<String> = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("Cargo.toml: a one-line `members = [...]`")
        .trim_end_matches(']')
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| {
            Path::new(m)
                .join("Cargo.toml")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        members.len() >= 4 && members.iter().any(|m| m == "crates/fuse/Cargo.toml"),
        "Cargo.toml: members read as {members:?}"
    );
    for member in &members {
        let m = read(member);
        assert!(
            m.contains("\n[lints]\nworkspace = true\n") && !m.contains("[lints."),
            "{member}: not the workspace's lints (`[lints]` `workspace = true`), or lints of its own"
        );
    }
    let mut repeated = Vec::new();
    let mut todo = vec![
        Path::new(ROOT).join("src"),
        Path::new(ROOT).join("tests"),
        Path::new(ROOT).join("crates"),
    ];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    todo.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let code = blank(&std::fs::read_to_string(&p).unwrap());
                for (n, line) in code.lines().enumerate() {
                    let l = line.replace(' ', "");
                    if ["#![deny(", "#![warn(", "#![forbid("]
                        .iter()
                        .any(|a| l.contains(a))
                    {
                        repeated.push(format!("{}:{}", p.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        repeated.is_empty(),
        "lint attributes outside Cargo.toml: {repeated:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The reader itself
// ---------------------------------------------------------------------------------------------

#[test]
fn the_reader_sees_code_only() {
    let src = r###"
// use crate::a;
/* crate::b /* nested */ crate::c */
let s = "crate::d \" crate::e";
let r = r#"crate::f " crate::g"#;
let c = '"'; let l: &'static str = x;
use crate::real::{one, two::Three, three::{self, Four}};
#[cfg(test)]
mod tests { use crate::hidden; }
#[cfg(test)]
use crate::hidden_too;
libc::open(p); libc::EINVAL; nix::unistd::close(fd);
"###;
    let code = strip_test_items(&blank(src));
    let found: Vec<String> = paths(&tokens(&code))
        .iter()
        .filter(|p| p.segs.len() > 1)
        .map(|p| p.segs.join("::") + if p.called { "()" } else { "" })
        .collect();
    assert_eq!(
        found,
        [
            "crate::real::one",
            "crate::real::two::Three",
            "crate::real::three::self",
            "crate::real::three::Four",
            "libc::open()",
            "libc::EINVAL",
            "nix::unistd::close()",
        ]
    );
}
