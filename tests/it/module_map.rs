//! The crate's module map stays as docs/design.md draws it: no source file imports, however
//! indirectly, a file that imports it back (tests aside), nor any top-level folder one that
//! imports it back, no child file implements its parent's type, every module is a `mod.rs` or a
//! single file, no file outgrows 700 lines of code, and the crate exports at most eight
//! modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file (the binary's `main.rs` aside), by its module path:
/// `crate`, `crate::store`, `crate::store::postgres::lane`, ...
fn modules() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&src(), &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src()).unwrap().with_extension("");
        let mut parts: Vec<String> = relative
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        match parts.last().map(String::as_str) {
            Some("main") if parts.len() == 1 => continue,
            Some("lib") if parts.len() == 1 => parts.clear(),
            Some("mod") => {
                parts.pop();
            }
            _ => {}
        }
        let path = std::iter::once("crate".to_owned())
            .chain(parts)
            .collect::<Vec<_>>()
            .join("::");
        modules.insert(path, file);
    }
    modules
}

/// The file's code: comments and its test-only modules (`#[cfg(test)] mod ...`) left out.
fn code(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut all = text.lines().peekable();
    while let Some(line) = all.next() {
        let trimmed = line.trim();
        let test_module = trimmed == "#[cfg(test)]"
            && all.peek().is_some_and(|next| {
                let next = next.trim_start();
                next.starts_with("mod ") || next.starts_with("pub(crate) mod ")
            });
        if test_module {
            // Up to the `}` at the module's own indentation.
            let indent = line.len() - line.trim_start().len();
            let closing = format!("{}}}", " ".repeat(indent));
            for line in all.by_ref() {
                if line.trim_end() == closing {
                    break;
                }
            }
            continue;
        }
        if !trimmed.is_empty() && !trimmed.starts_with("//") {
            lines.push(line);
        }
    }
    lines
}

/// The module paths a file names: `crate::a::b`, `super::c`, `self::d`, with each member
/// of a braced group (`super::{a, b::c}`) on its own, made absolute from `module`.
fn named_paths(module: &str, code: &str) -> Vec<String> {
    let parent = |path: &str| {
        path.rsplit_once("::")
            .map_or("crate", |(up, _)| up)
            .to_owned()
    };
    let mut found = Vec::new();
    // A child module named bare (`use file::ConfigFile;` in its parent) is `self::file`.
    let children: Vec<&str> = code
        .lines()
        .filter_map(|line| {
            let declared = line.trim().strip_suffix(';')?;
            let (visibility, name) = declared.rsplit_once("mod ")?;
            let visibility = visibility.trim();
            (visibility.is_empty() || visibility.starts_with("pub")).then_some(name)
        })
        .collect();
    for child in children {
        for (at, _) in code.match_indices(&format!("{child}::")) {
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            collect(module, &code[at..], &mut found);
        }
    }
    for (start, root) in [
        ("crate::", "crate"),
        ("super::", "super"),
        ("self::", "self"),
    ] {
        for (at, _) in code.match_indices(start) {
            // Only a path's start: not `x::super::`, not inside an identifier.
            let before = code[..at].chars().last();
            let visibility = code[..at].ends_with("pub(in ");
            if visibility || before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base = match root {
                "crate" => "crate".to_owned(),
                "super" => parent(module),
                _ => module.to_owned(),
            };
            let rest = &code[at + start.len()..];
            collect(&base, rest, &mut found);
        }
    }
    found
}

/// Adds the paths `rest` continues `base` with: a name chain, or a braced group.
fn collect(base: &str, rest: &str, found: &mut Vec<String>) {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let (mut depth, mut item_start) = (0, 0);
        for (at, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    collect(base, &group[item_start..at], found);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    collect(base, &group[item_start..at], found);
                    item_start = at + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let length = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let name = &rest[..length];
    if name.is_empty() || name == "self" {
        return;
    }
    // `super::super::x`: each `super` goes one module up.
    if name == "super" {
        let up = base.rsplit_once("::").map_or("crate", |(up, _)| up);
        if let Some(after) = rest[length..].strip_prefix("::") {
            collect(up, after, found);
        }
        return;
    }
    let path = format!("{base}::{name}");
    found.push(path.clone());
    if let Some(after) = rest[length..].strip_prefix("::") {
        collect(&path, after, found);
    }
}

/// Which file imports which, by module path, as far as the code names modules.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let code = code(&text).join("\n");
        let mut targets = BTreeSet::new();
        for path in named_paths(module, &code) {
            // The longest prefix of the path that is a file of the crate.
            let mut candidate = path.as_str();
            loop {
                if modules.contains_key(candidate) {
                    // The crate root only declares the modules and re-exports the app's
                    // entry points: naming it is naming those modules.
                    if candidate != module && candidate != "crate" {
                        targets.insert(candidate.to_owned());
                    }
                    break;
                }
                match candidate.rsplit_once("::") {
                    Some((up, _)) => candidate = up,
                    None => break,
                }
            }
        }
        // A parent names its children only to declare them (`mod x;`), which is no use.
        graph.insert(module.clone(), targets);
    }
    graph
}

/// The files that import each other in a loop, each loop once.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's strongly connected components.
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g str) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        for target in state.graph.get(node).into_iter().flatten() {
            let target = target.as_str();
            if !state.index.contains_key(target) {
                visit(state, target);
                let low = state.low[target].min(state.low[node]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(target) {
                let low = state.index[target].min(state.low[node]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.to_owned());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    assert!(
        graph.len() > 50,
        "the crate's files were found: {}",
        graph.len()
    );
    let found = cycles(&graph);
    let described = ties(&found, &graph, |from, to| format!("{from} -> {to}"));
    assert!(found.is_empty(), "import cycles:\n{}", described.join("\n"));
}

/// Each import inside each cycle of `graph`, as `tie` describes it, a cycle a line.
fn ties(
    found: &[Vec<String>],
    graph: &BTreeMap<String, BTreeSet<String>>,
    tie: impl Fn(&str, &str) -> String,
) -> Vec<String> {
    let each = |cycle: &Vec<String>| {
        let inside = cycle.iter().flat_map(|from| {
            let targets = graph[from].iter().filter(|to| cycle.contains(to));
            targets.map(|to| tie(from, to)).collect::<Vec<_>>()
        });
        inside.collect::<Vec<_>>().join(", ")
    };
    found.iter().map(each).collect()
}

/// The crate's top-level modules (a folder, or a file beside `lib.rs`) import one another
/// one way: no folder reaches, through any of its files, a folder that reaches it back.
/// Configuration, say, is read into settings that `store/` and `route/` define, so that
/// neither imports `config/`.
#[test]
fn no_folder_imports_one_that_imports_it_back() {
    let top = |module: &str| {
        let mut parts = module.split("::");
        let (root, name) = (parts.next(), parts.next());
        root.zip(name).map(|(root, name)| format!("{root}::{name}"))
    };
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut through: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in imports() {
        let Some(from_folder) = top(&from) else {
            continue;
        };
        let entry = folders.entry(from_folder.clone()).or_default();
        for to in targets {
            if let Some(to_folder) = top(&to).filter(|folder| *folder != from_folder) {
                entry.insert(to_folder.clone());
                through
                    .entry((from_folder.clone(), to_folder))
                    .or_default()
                    .insert(from.clone());
            }
        }
    }
    assert!(folders.len() > 20, "{folders:?}");
    let found = cycles(&folders);
    let described = ties(&found, &folders, |from, to| {
        let files = &through[&(from.to_owned(), to.to_owned())];
        format!("{from} -> {to} (in {files:?})")
    });
    assert!(found.is_empty(), "folder cycles:\n{}", described.join("\n"));
}

/// The types a file defines: `struct` and `enum` items at its top level.
fn defined_types(code: &[&str]) -> BTreeSet<String> {
    let mut types = BTreeSet::new();
    for line in code.iter().filter(|line| !line.starts_with(' ')) {
        // Past any visibility: `pub`, `pub(crate)`, `pub(in crate::a)`.
        let rest = match line.strip_prefix("pub(") {
            Some(scoped) => scoped.split_once(") ").map_or("", |(_, rest)| rest),
            None => line.trim_start_matches("pub "),
        };
        for kind in ["struct ", "enum "] {
            if let Some(named) = rest.strip_prefix(kind) {
                let name: String = named
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                types.insert(name);
            }
        }
    }
    types
}

/// The type an inherent `impl` line implements (`impl<T> super::Proxy<T> where ... {`
/// is `Proxy`); `None` for a trait's impl.
fn implemented_type(header: &str) -> Option<&str> {
    let mut rest = header.strip_prefix("impl")?;
    // Past the impl's own generic parameters, however nested.
    if rest.starts_with('<') {
        let mut depth = 0;
        let end = rest.char_indices().find_map(|(at, c)| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(at)
        })?;
        rest = &rest[end + 1..];
    }
    let rest = rest.trim_start();
    let path = rest.split(['<', ' ', '{']).next()?;
    if rest.contains(" for ") || path.is_empty() {
        return None;
    }
    path.rsplit("::").next()
}

/// The parser of `impl` lines reads every way an inherent impl is written.
#[test]
fn an_impl_line_names_its_type_however_written() {
    for (header, implemented) in [
        ("impl Proxy {", Some("Proxy")),
        ("impl super::Proxy {", Some("Proxy")),
        ("impl crate::proxy::Proxy {", Some("Proxy")),
        ("impl<T> Parent<T> {", Some("Parent")),
        (
            "impl<T: Into<Vec<u8>>> Parent<T, B> where T: Send {",
            Some("Parent"),
        ),
        ("impl Parent<'_> {", Some("Parent")),
        ("impl Display for Proxy {", None),
        ("impl<T> From<T> for Proxy {", None),
    ] {
        assert_eq!(implemented_type(header), implemented, "{header}");
    }
}

/// A child file gets what it needs of its parent's type passed to it (a context struct,
/// as `queue/attempt.rs`'s `AttemptContext`), rather than implementing the parent's type
/// and reaching into its private fields: what a step uses stays visible where it is made.
#[test]
fn no_child_file_implements_its_parents_type() {
    let modules = modules();
    let mut found = Vec::new();
    for (module, file) in &modules {
        let Some((parent, _)) = module.rsplit_once("::") else {
            continue;
        };
        let Some(parent_file) = modules.get(parent) else {
            continue;
        };
        let parent_text = std::fs::read_to_string(parent_file).unwrap();
        let parent_types = defined_types(&code(&parent_text));
        let text = std::fs::read_to_string(file).unwrap();
        for line in code(&text)
            .iter()
            .filter(|line| line.trim_start().starts_with("impl"))
        {
            let header = line.trim();
            if let Some(name) = implemented_type(header)
                && parent_types.contains(name)
            {
                let relative = file.strip_prefix(src()).unwrap_or(file);
                found.push(format!("src/{}: {header}", relative.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "child files implementing their parent's type:\n{}",
        found.join("\n")
    );
}

/// The check itself finds a cycle where there is one.
#[test]
fn a_cycle_is_found_where_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("crate::a", vec!["crate::b"]),
        ("crate::b", vec!["crate::c"]),
        ("crate::c", vec!["crate::a"]),
        ("crate::d", vec!["crate::a"]),
    ]
    .into_iter()
    .map(|(from, to)| (from.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].len(), 3);
    let paths = named_paths(
        "crate::store::postgres::lane",
        "use super::{record::{live_state, unsigned}, Store};\nuse crate::store::KeyState;",
    );
    let parent = named_paths("crate::config", "mod file;\nuse file::ConfigFile;");
    assert!(
        parent.iter().any(|p| p == "crate::config::file"),
        "a child named bare: {parent:?}"
    );
    for expected in [
        "crate::store::postgres::record",
        "crate::store::postgres::Store",
        "crate::store::KeyState",
    ] {
        assert!(
            paths.iter().any(|p| p == expected),
            "{expected} in {paths:?}"
        );
    }
}

#[test]
fn the_crate_exports_at_most_eight_modules() {
    // What the binary, the tests and the fuzz targets use; the rest stays the crate's own,
    // so that the compiler names what nothing uses.
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let public: Vec<&str> = lib
        .lines()
        .filter(|line| line.starts_with("pub mod "))
        .collect();
    assert!(public.len() <= 8, "{public:?}");
}

#[test]
fn every_module_is_a_mod_rs_or_a_single_file() {
    // A folder's module is its mod.rs: no `x.rs` beside an `x/` folder.
    let mut mixed = Vec::new();
    for file in modules().values() {
        if file.file_name().is_some_and(|name| name != "mod.rs") && file.with_extension("").is_dir()
        {
            mixed.push(file.strip_prefix(src()).unwrap().display().to_string());
        }
    }
    assert!(mixed.is_empty(), "modules beside their folder: {mixed:?}");
}

#[test]
fn no_source_file_has_more_than_700_lines_of_code() {
    let mut large = Vec::new();
    for file in modules().values() {
        let lines = code(&std::fs::read_to_string(file).unwrap()).len();
        if lines > 700 {
            large.push(format!(
                "{}: {lines}",
                file.strip_prefix(src()).unwrap().display()
            ));
        }
    }
    assert!(large.is_empty(), "files over 700 lines of code: {large:?}");
}

/// A function that runs past 80 lines of code is split into named steps.
#[test]
fn no_function_runs_past_80_lines_of_code() {
    let mut long = Vec::new();
    for file in modules().values() {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = code(&text);
        for (start, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let signature = [
                "fn ",
                "pub fn ",
                "async fn ",
                "pub async fn ",
                "pub(crate) fn ",
            ]
            .iter()
            .chain(&[
                "pub(super) fn ",
                "pub(crate) async fn ",
                "pub(super) async fn ",
            ])
            .any(|start| trimmed.starts_with(start));
            if !signature || trimmed.ends_with(';') {
                continue;
            }
            // Up to the `}` at the signature's indentation.
            let indent = line.len() - trimmed.len();
            let closing = format!("{}}}", " ".repeat(indent));
            let length = lines[start..]
                .iter()
                .position(|line| line.trim_end() == closing)
                .map_or(0, |end| end + 1);
            if length > 80 {
                let name = trimmed.split('(').next().unwrap_or(trimmed);
                long.push(format!(
                    "{} {name}: {length}",
                    file.strip_prefix(src()).unwrap().display()
                ));
            }
        }
    }
    assert!(long.is_empty(), "functions over 80 lines of code: {long:?}");
}

/// Every file of `tests/it/` is a module of the test binary: one left out of `main.rs`
/// would never be compiled, and its tests would pass by never running.
#[test]
fn every_test_file_is_declared_in_the_test_binary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let module = match path.extension().and_then(|ext| ext.to_str()) {
            Some("rs") if name != "main" => name,
            None if path.join("mod.rs").exists() => name,
            _ => continue,
        };
        files += 1;
        assert!(
            main.lines().any(|line| line == format!("mod {module};")),
            "tests/it/main.rs does not declare `mod {module};`"
        );
    }
    assert!(files > 40, "{files} test modules");
    // A file directly under tests/ would be a binary of its own, without `support`.
    let stray: Vec<_> = std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    assert!(stray.is_empty(), "test files outside tests/it/: {stray:?}");
}
