//! Imports point one way (docs/architecture.md, "Module map"): the source
//! trees of the workspace's crates are read as they are (`src/` the binary's,
//! `crates/services/src/`, `crates/core/src/`), each file's `crate::…` paths
//! (and `gpureap::…`, `gpureap_core::…`, `gpureap_services::…`) give the
//! edges between top-level modules (`src/fleet/*` is `fleet`; the crates'
//! module names are distinct), and the graph they make must have no cycle.
//! Every layer is checked, front ends included: a module imports nothing of
//! a layer above it, and no front end imports another. Only the entry (main,
//! config) reads the command line as typed (`cli`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that may import `cli`, and why each one that is not the entry may.
const CLI_READERS: &[(&str, &str)] = &[
    ("main", "the entry: parses the command line"),
    (
        "config",
        "the entry: turns the command line into typed config",
    ),
];

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let graph = module_graph();
    assert!(graph.len() > 10, "the source tree was not read: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        let mut edges = String::new();
        for pair in cycle.windows(2) {
            edges.push_str(&format!(
                "\n  {} -> {}: {}",
                pair[0],
                pair[1],
                graph[&pair[0]][&pair[1]].join(", ")
            ));
        }
        let groups: Vec<String> = tangles(&graph)
            .iter()
            .map(|group| format!("{{{}}}", group.join(", ")))
            .collect();
        panic!(
            "the imports between top-level modules have a cycle: {}{edges}\n\
             modules that import each other, in all: {}",
            cycle.join(" -> "),
            groups.join(" ")
        );
    }
}

#[test]
fn only_the_entry_imports_cli() {
    let graph = module_graph();
    assert!(
        graph.get("config").is_some_and(|to| to.contains_key("cli")),
        "config does not import cli: the reading of the tree is wrong"
    );
    let allowed: BTreeSet<&str> = CLI_READERS.iter().map(|(module, _)| *module).collect();
    let readers: Vec<String> = graph
        .iter()
        .filter(|(module, to)| to.contains_key("cli") && !allowed.contains(module.as_str()))
        .map(|(module, to)| format!("{module} ({})", to["cli"].join(", ")))
        .collect();
    assert!(
        readers.is_empty(),
        "only main and config may import cli (they turn it into typed config); also: {}",
        readers.join("; ")
    );
}

/// The layers of docs/architecture.md ("Module map"), top to bottom, and the
/// source tree (crate) each lives in. A new top-level module is placed here,
/// or the tests below fail.
const LAYERS: &[(&str, &[&str])] = &[
    ("entry", &["main", "cli", "config"]),
    (
        "front ends",
        &[
            "status",
            "free",
            "waiting",
            "resetting",
            "fleet",
            "slurm",
            "exporter",
            "check",
            "run",
            "demo",
            "dump",
            "watch",
            "top",
        ],
    ),
    (
        "services",
        &[
            "request",
            "remote",
            "status_doc",
            "http",
            "metrics",
            "state",
            "bundle",
            "scontrol",
            "supervision",
            "plan",
        ],
    ),
    ("report", &["report"]),
    (
        "pipeline",
        &[
            "snapshot",
            "supervised",
            "select",
            "reap",
            "verify",
            "wait",
            "reset",
            "tree",
            "stacks",
            "pace",
        ],
    ),
    ("driver", &["driver"]),
    (
        "base",
        &[
            "proc",
            "units",
            "exit",
            "signal",
            "child",
            "hostlist",
            "file",
            "container",
            "members",
            "stdout",
        ],
    ),
];

/// The source trees, each the crate of the layers it holds (the compiler
/// holds the arrows between crates; this test those inside one).
const TREES: &[(&str, &[&str])] = &[
    ("src", &["entry", "front ends"]),
    ("crates/services/src", &["services"]),
    ("crates/core/src", &["report", "pipeline", "driver", "base"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

#[test]
fn no_module_imports_a_layer_above_it_and_no_front_end_another() {
    let graph = module_graph();
    let front_ends = LAYERS
        .iter()
        .position(|(name, _)| *name == "front ends")
        .expect("a layer of front ends");
    let mut wrong = Vec::new();
    for (module, to) in &graph {
        let Some(layer) = layer_of(module) else {
            wrong.push(format!(
                "{module} is in no layer: place it in LAYERS and docs/architecture.md"
            ));
            continue;
        };
        for (used, files) in to {
            match layer_of(used) {
                Some(above) if above < layer => wrong.push(format!(
                    "{module} ({}) imports {used} ({}): {}",
                    LAYERS[layer].0,
                    LAYERS[above].0,
                    files.join(", ")
                )),
                Some(same) if same == layer && layer == front_ends => wrong.push(format!(
                    "front end {module} imports front end {used} (move what both need into the services): {}",
                    files.join(", ")
                )),
                _ => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up or across the front ends:\n  {}",
        wrong.join("\n  ")
    );
}

/// The test reads what it means to: a front end importing another, and a
/// service importing a front end, are found where they are written.
#[test]
fn the_reading_finds_an_import_across_the_front_ends() {
    let code = code_only(
        "use crate::fleet::commands;\nuse crate::{top, remote::Fleet};\n// crate::watch\nlet _ = \"crate::run\";",
    );
    let found = imported_modules(&code, "crate");
    assert_eq!(
        found,
        BTreeSet::from(["fleet".to_string(), "remote".to_string(), "top".to_string()])
    );
}

/// Each module lives in the crate of its layer: a service written into the
/// binary, or a front end into the core, is a move not made.
#[test]
fn each_module_lives_in_the_crate_of_its_layer() {
    let mut wrong = Vec::new();
    for (tree, layers) in TREES {
        for (module, _) in modules_of(tree) {
            match layer_of(&module) {
                Some(layer) if layers.contains(&LAYERS[layer].0) => {}
                Some(layer) => wrong.push(format!(
                    "{module} ({}) is in {tree}, the crate of {}",
                    LAYERS[layer].0,
                    layers.join(", ")
                )),
                None => wrong.push(format!("{module} ({tree}) is in no layer")),
            }
        }
    }
    assert!(wrong.is_empty(), "modules out of their crate: {wrong:#?}");
}

/// module -> imported module -> the files that import it.
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// The longest a function of the crates may be, in lines, and the ones that may
/// be longer, and why: orchestration is split along the pipeline's steps.
const LONGEST_FUNCTION: usize = 100;
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[(
    "crates/core/src/exit.rs",
    "rows",
    "the one exit table, data: a row per program",
)];

#[test]
fn no_function_is_over_a_hundred_lines() {
    let mut long = Vec::new();
    for (relative, code) in sources() {
        // Unit tests are not orchestration: a `#[cfg(test)]` module, inline or
        // in a file of its own (`mod tests;`, crates/services/src/plan/tests.rs).
        if relative.ends_with("/tests.rs") {
            continue;
        }
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for (name, lines) in function_lengths(code) {
            let allowed = LONG_FUNCTIONS
                .iter()
                .any(|(file, function, _)| *file == relative && *function == name);
            if lines > LONGEST_FUNCTION && !allowed {
                long.push(format!("{relative}: fn {name}: {lines} lines"));
            }
        }
    }
    assert!(long.is_empty(), "split these along their steps: {long:#?}");
}

/// Each function with a body in `code` (comments and literals blanked), and
/// how many lines it spans, from `fn` to its closing brace.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = code[at..].find("fn ") {
        let start = at + offset;
        at = start + 3;
        if start > 0 && is_ident(bytes[start - 1]) {
            continue;
        }
        let name: String = code[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body opens at the first `{` outside parentheses and brackets; a
        // `;` first is a declaration without one.
        let mut depth = 0i32;
        let mut open = None;
        for (index, &byte) in bytes.iter().enumerate().skip(at) {
            match byte {
                b'(' | b'[' | b'<' => depth += 1,
                b')' | b']' => depth -= 1,
                b'>' if index > 0 && bytes[index - 1] != b'-' => depth -= 1,
                b';' if depth <= 0 => break,
                b'{' if depth <= 0 => {
                    open = Some(index);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0i32;
        let mut close = None;
        for (index, &byte) in bytes.iter().enumerate().skip(open) {
            match byte {
                b'{' => braces += 1,
                b'}' => {
                    braces -= 1;
                    if braces == 0 {
                        close = Some(index);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        let lines = code[start..=close].lines().count();
        found.push((name, lines));
    }
    found
}

/// A module re-exports nothing of another module (`pub use crate::…`): an
/// item is named by the module that owns it, never kept at an old path.
#[test]
fn nothing_is_re_exported_from_another_module() {
    let mut found = Vec::new();
    for (relative, code) in sources() {
        for line in code.lines() {
            let line = line.trim_start();
            let re_export = ["pub use ", "pub(crate) use "].iter().any(|start| {
                ["crate::", "gpureap_core::", "gpureap_services::"]
                    .iter()
                    .any(|path| line.starts_with(&format!("{start}{path}")))
            });
            if re_export {
                found.push(format!("{relative}: {line}"));
            }
        }
    }
    assert!(found.is_empty(), "re-exported at another path: {found:#?}");
}

/// Files that may end the process themselves, and why: everything else
/// returns its `Exit` to main, which ends the process through the table
/// (`Exit::exit`). No thread (a deadline, a watcher) ends it on its own.
const PROCESS_ENDERS: &[(&str, &str)] = &[
    (
        "src/main.rs",
        "the entry: ends the process with the code it dispatched to",
    ),
    ("crates/core/src/exit.rs", "the table: `Exit::exit`"),
    (
        "crates/core/src/driver/sim/stand_in.rs",
        "the stand-in process's own main (a separate process gpureap starts)",
    ),
    (
        "src/demo.rs",
        "the demo's Ctrl-C handler, after it killed what it staged",
    ),
    (
        "src/top/live/term.rs",
        "top's handler of a second SIGTERM/SIGHUP/SIGINT, for a view that did not end on the first",
    ),
];

#[test]
fn only_main_ends_the_process() {
    let mut enders = Vec::new();
    for (relative, code) in sources() {
        if PROCESS_ENDERS.iter().any(|(file, _)| *file == relative) {
            continue;
        }
        let code: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        // `process::exit(…)`, or an `Exit` value ended on: `Exit::StillHeld.exit()`.
        let ends = code.contains("process::exit(")
            || code.match_indices(".exit()").any(|(at, _)| {
                let before = &code[..at];
                let start = before
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .map_or(0, |i| i + 1);
                before[start..].starts_with("Exit::")
            });
        if ends {
            enders.push(relative);
        }
    }
    assert!(
        enders.is_empty(),
        "these end the process instead of returning their Exit to main: {enders:?}"
    );
}

/// The top-level modules of a source tree, each with its files.
fn modules_of(tree: &str) -> BTreeMap<String, Vec<PathBuf>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(tree);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under the tree");
        let first = relative
            .components()
            .next()
            .expect("a path")
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        // lib.rs declares the modules, and names the lower crates' for
        // the crate's own paths: no edge of its own.
        if module != "lib" {
            modules.entry(module).or_default().push(file);
        }
    }
    modules
}

fn module_graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut graph = Graph::new();
    for (tree, _) in TREES {
        for (module, files) in modules_of(tree) {
            let to = graph.entry(module.clone()).or_default();
            for file in files {
                let text = std::fs::read_to_string(&file).expect("a readable source file");
                let name = file
                    .strip_prefix(root)
                    .expect("under the workspace")
                    .display()
                    .to_string();
                let code = code_only(&text);
                let used = ["crate", "gpureap", "gpureap_core", "gpureap_services"]
                    .iter()
                    .flat_map(|prefix| imported_modules(&code, prefix));
                for used in used {
                    if used != module {
                        let files = to.entry(used).or_default();
                        if !files.contains(&name) {
                            files.push(name.clone());
                        }
                    }
                }
            }
        }
    }
    graph
}

/// Every source file of the workspace's crates, by its path from the
/// workspace's root, with its comments and literals blanked (`code_only`).
fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for (tree, _) in TREES {
        rust_files(&root.join(tree), &mut files);
    }
    files
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(root)
                .expect("under the workspace")
                .to_string_lossy()
                .into_owned();
            let code = code_only(&std::fs::read_to_string(&path).expect("a source file"));
            (relative, code)
        })
        .collect()
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a source tree is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            into.push(path);
        }
    }
}

/// The text with comments, string and character literals blanked out, so that
/// a path written in a doc comment or a message is not an import.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // r"…", r#"…"#
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The top-level modules a file's code names through `PREFIX::module` paths,
/// including `use PREFIX::{a, b::c}` groups.
fn imported_modules(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    let pattern = format!("{prefix}::");
    let mut rest = code;
    while let Some(at) = rest.find(&pattern) {
        let before = rest[..at].chars().last();
        rest = &rest[at + pattern.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `my_crate::`
        }
        let trimmed = rest.trim_start();
        if let Some(group) = trimmed.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            let mut end = group.len();
            for (index, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = index;
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        push_ident(&group[start..index], &mut modules);
                        start = index + 1;
                    }
                    _ => {}
                }
            }
            push_ident(&group[start..end], &mut modules);
        } else {
            push_ident(trimmed, &mut modules);
        }
    }
    modules
}

fn push_ident(path: &str, into: &mut BTreeSet<String>) {
    let ident: String = path
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if !ident.is_empty() && ident != "self" && ident.chars().next().is_some_and(char::is_lowercase)
    {
        into.insert(ident);
    }
}

/// The groups of modules that reach each other (the strongly connected
/// components with more than one module).
fn tangles(graph: &Graph) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flat_map(|to| to.keys()) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|node| (node, reach(node))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for (node, from_node) in &reaches {
        let group: Vec<String> = from_node
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|back| back.contains(*node)))
            .cloned()
            .collect();
        if group.len() > 1 && !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups
}

/// A cycle, as the modules along it with the first repeated at the end.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|to| to.keys()) {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = path.iter().position(|n| n == next).expect("on the path");
                    let mut cycle = path[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(next, graph, marks, path) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if marks.get(node).copied().unwrap_or(Mark::New) == Mark::New
            && let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_reading_finds_paths_in_code_and_not_in_comments_or_strings() {
    let code = code_only(
        "use crate::{a::B, b, self};\n// crate::c\nlet s = \"crate::d\"; let t = 'x';\n\
         fn f<'a>() { crate::e::f() }\n/* crate::g */ let r = r#\"crate::h\"#;",
    );
    let found = imported_modules(&code, "crate");
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["a", "b", "e"],
        "from {code:?}"
    );
    let mut graph = Graph::new();
    for (from, to) in [("x", "y"), ("y", "z"), ("z", "x")] {
        graph
            .entry(from.into())
            .or_default()
            .insert(to.into(), vec![]);
    }
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["x".into(), "y".into(), "z".into(), "x".into()])
    );
    graph.get_mut("z").expect("z").clear();
    assert_eq!(find_cycle(&graph), None);
}
