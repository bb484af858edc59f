//! Several kernels' WGSL joined into one module, so that one dispatch can run them in
//! turn (`ops::chain`). Each kernel keeps its own code and bindings: every name it
//! declares at module scope gets a suffix of its own (`_ch0`, `_ch1`, ..), its bindings
//! move up by a base of its own (they stay in group 0: lavapipe crashed running joined
//! kernels from several groups), and its entry point becomes a plain function whose
//! builtins are arguments, called by the joined module's entry point.
//!
//! The renaming works on tokens, not on a parse tree, which WGSL's grammar allows: a
//! name declared at module scope is renamed wherever it appears as an identifier (a
//! local that shadows it is renamed alike, so the meaning is kept), except after a `.`
//! (members and swizzles) and where a struct declares its members.

use crate::{Error, Result};

/// One kernel made ready to join: its renamed source and how to call its entry point.
#[derive(Clone, Debug)]
pub struct Linked {
    /// Renamed source, without its entry point's attributes and `enable` directives.
    pub body: String,
    /// The directives it needs (`enable f16;`).
    pub directives: Vec<String>,
    /// Its entry point's new name.
    pub entry: String,
    /// The builtin of each of the entry point's parameters, in order.
    pub builtins: Vec<String>,
    /// Its workgroup size expression, renamed (`WG_ch0`).
    pub workgroup_size: String,
    /// Its override constants: (name in the kernel, renamed).
    pub overrides: Vec<(String, String)>,
}

/// The suffix of kernel `k`'s names.
pub fn suffix(k: usize) -> String {
    format!("_ch{k}")
}

/// `src` (one kernel, bindings in group 0, entry point `main`) renamed as the `k`-th
/// kernel of a joined module, its binding b at `base` + b.
pub fn link(src: &str, k: usize, base: u32) -> Result<Linked> {
    let src = strip_comments(src);
    let (directives, src) = split_directives(&src);
    let (src, entry) = lift_entry(&src)?;
    let tokens = tokenize(&src);
    let declared = module_names(&tokens);
    let sfx = suffix(k);
    for name in &declared {
        let renamed = format!("{name}{sfx}");
        if declared.contains(&renamed) {
            return Err(Error::gpu(format!(
                "joining kernels: {renamed} is declared already"
            )));
        }
    }
    let body = move_bindings(&rename(&tokens, &declared, &sfx), base)?;
    let overrides = override_names(&tokens)
        .into_iter()
        .map(|n| {
            let r = format!("{n}{sfx}");
            (n, r)
        })
        .collect();
    let wg_tokens = tokenize(&entry.workgroup_size);
    Ok(Linked {
        body,
        directives,
        entry: format!("main{sfx}"),
        builtins: entry.builtins,
        workgroup_size: rename(&wg_tokens, &declared, &sfx),
        overrides,
    })
}

/// `src` with each module-scope `var<uniform> NAME: T;` made `array<T, 1>` and every use
/// of NAME read as `NAME[index]`: the loads' offsets then depend on `index`, a value
/// the compiler cannot see, so lavapipe finds no uniform to inline in them (its search
/// for them corrupted its heap on joined kernels, docs/perf.md). `T` must be a size
/// that an array in a uniform may hold (a multiple of 16 bytes); WGSL's validation
/// refuses it otherwise.
pub fn index_uniforms(src: &str, index: &str) -> String {
    let tokens = tokenize(src);
    let mut names = Vec::new();
    for i in module_scope(&tokens) {
        if tokens[i].text != "var" {
            continue;
        }
        let Some(j) = next_solid(&tokens, i).filter(|&j| tokens[j].text == "<") else {
            continue;
        };
        let Some(k) = next_solid(&tokens, j).filter(|&k| tokens[k].text == "uniform") else {
            continue;
        };
        let name = next_solid(&tokens, k).and_then(|g| next_solid(&tokens, g));
        if let Some(n) = name.filter(|&n| tokens[n].kind == Kind::Ident) {
            names.push(n);
        }
    }
    let declared: Vec<&str> = names.iter().map(|&n| tokens[n].text).collect();
    let mut out = String::with_capacity(src.len() + 64);
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i];
        out.push_str(t.text);
        if names.contains(&i) {
            // The declaration: `NAME: T;` becomes `NAME: array<T, 1>;`.
            let colon = next_solid(&tokens, i).filter(|&c| tokens[c].text == ":");
            let semi = colon.and_then(|c| (c..tokens.len()).find(|&k| tokens[k].text == ";"));
            if let (Some(c), Some(e)) = (colon, semi) {
                let ty: String = tokens[c + 1..e].iter().map(|t| t.text).collect();
                out.push_str(&format!(": array<{}, 1>;", ty.trim()));
                i = e + 1;
                continue;
            }
        } else if t.kind == Kind::Ident
            && declared.contains(&t.text)
            && prev_solid(&tokens, i).is_none_or(|j| tokens[j].text != ".")
        {
            out.push_str(&format!("[{index}]"));
        }
        i += 1;
    }
    out
}

/// `src` with every `@binding(b)` at `base` + b; every binding must be in group 0.
fn move_bindings(src: &str, base: u32) -> Result<String> {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("@group(") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "@group(".len()..];
        let close = matching_paren(after)?;
        if after[..close].trim() != "0" {
            return Err(Error::gpu("joining kernels: a binding outside group 0"));
        }
        let after = after[close + 1..].trim_start();
        let Some(b) = after.strip_prefix("@binding(") else {
            return Err(Error::gpu(
                "joining kernels: @group without @binding after it",
            ));
        };
        let close = matching_paren(b)?;
        let n: u32 = b[..close]
            .trim()
            .parse()
            .map_err(|_| Error::gpu("joining kernels: a binding that is not a number"))?;
        out.push_str(&format!("@group(0) @binding({})", base + n));
        rest = &b[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `src` without `//` and `/* */` comments (block comments nest in WGSL).
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let mut start = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            out.push_str(&src[start..i]);
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            start = i;
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            out.push_str(&src[start..i]);
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
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
            start = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&src[start.min(src.len())..]);
    out
}

/// The `enable` / `requires` / `diagnostic` directives, and the rest.
fn split_directives(src: &str) -> (Vec<String>, String) {
    let mut dirs = Vec::new();
    let mut rest = String::with_capacity(src.len());
    for line in src.lines() {
        let t = line.trim_start();
        if t.starts_with("enable ") || t.starts_with("requires ") || t.starts_with("diagnostic(") {
            dirs.push(t.trim().to_string());
        } else {
            rest.push_str(line);
            rest.push('\n');
        }
    }
    (dirs, rest)
}

/// What [`lift_entry`] takes from the entry point.
struct Entry {
    workgroup_size: String,
    builtins: Vec<String>,
}

/// `src` with its one `@compute` entry point made a plain function: the attribute and
/// `@workgroup_size(..)` removed, and each parameter's `@builtin(..)` (recorded).
fn lift_entry(src: &str) -> Result<(String, Entry)> {
    let bad = |what: &str| Err(Error::gpu(format!("joining kernels: {what}")));
    let Some(at) = src.find("@compute") else {
        return bad("no @compute entry point");
    };
    if src[at + 1..].contains("@compute") {
        return bad("more than one @compute entry point");
    }
    let after = &src[at + "@compute".len()..];
    let Some(ws) = after.find("@workgroup_size(") else {
        return bad("the entry point has no @workgroup_size");
    };
    let ws_open = ws + "@workgroup_size(".len();
    let ws_close = ws_open + matching_paren(&after[ws_open..])?;
    let workgroup_size = after[ws_open..ws_close].trim().to_string();
    let rest = &after[ws_close + 1..];
    let Some(fn_at) = rest.find("fn ") else {
        return bad("no function after @compute");
    };
    if !rest[..fn_at].trim().is_empty() {
        return bad("attributes other than @workgroup_size on the entry point");
    }
    let Some(open) = rest[fn_at..].find('(').map(|o| fn_at + o + 1) else {
        return bad("the entry point has no parameter list");
    };
    if rest[fn_at + 3..open - 1].trim() != "main" {
        return bad("the entry point is not named main");
    }
    let close = open + matching_paren(&rest[open..])?;
    let mut params = Vec::new();
    let mut builtins = Vec::new();
    for p in split_top(&rest[open..close]) {
        let p = p.trim();
        if p.is_empty() {
            continue;
        }
        let Some(b) = p.strip_prefix("@builtin(") else {
            return bad("an entry point parameter that is not a builtin");
        };
        let Some(end) = b.find(')') else {
            return bad("an unclosed @builtin");
        };
        builtins.push(b[..end].trim().to_string());
        params.push(b[end + 1..].trim().to_string());
    }
    let mut out = String::with_capacity(src.len());
    out.push_str(&src[..at]);
    out.push_str(&rest[..open]);
    out.push_str(&params.join(", "));
    out.push_str(&rest[close..]);
    Ok((
        out,
        Entry {
            workgroup_size,
            builtins,
        },
    ))
}

/// The offset of the `)` that closes a `(` just before `s`.
fn matching_paren(s: &str) -> Result<usize> {
    let mut depth = 1;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
    }
    Err(Error::gpu("joining kernels: an unclosed parenthesis"))
}

/// `s` split at its commas outside parentheses and angle brackets.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ident,
    /// A number literal, copied as it is (so that `8u` is not read as `8` and `u`).
    Number,
    /// Anything else: punctuation and white space, one character at a time.
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    kind: Kind,
    text: &'a str,
}

fn tokenize(src: &str) -> Vec<Token<'_>> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let kind = if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            Kind::Ident
        } else if b[i].is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            Kind::Number
        } else {
            // One character (multi-byte ones whole).
            i += src[i..].chars().next().map_or(1, char::len_utf8);
            Kind::Other
        };
        out.push(Token {
            kind,
            text: &src[start..i],
        });
    }
    out
}

/// The index of the next token after `i` that is not white space.
fn next_solid(tokens: &[Token<'_>], i: usize) -> Option<usize> {
    (i + 1..tokens.len()).find(|&j| !tokens[j].text.trim().is_empty())
}

/// The index of the last token before `i` that is not white space.
fn prev_solid(tokens: &[Token<'_>], i: usize) -> Option<usize> {
    (0..i).rev().find(|&j| !tokens[j].text.trim().is_empty())
}

/// The indices of the tokens outside every brace (module scope).
fn module_scope(tokens: &[Token<'_>]) -> Vec<usize> {
    let mut depth = 0i32;
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        match t.text {
            "{" => depth += 1,
            "}" => depth -= 1,
            _ if depth == 0 => out.push(i),
            _ => {}
        }
    }
    out
}

/// The names declared at module scope: functions, structs, constants, overrides,
/// aliases and variables.
fn module_names(tokens: &[Token<'_>]) -> Vec<String> {
    let mut names = Vec::new();
    for i in module_scope(tokens) {
        let t = tokens[i];
        let declares = matches!(
            t.text,
            "fn" | "struct" | "const" | "override" | "alias" | "var"
        );
        if t.kind != Kind::Ident || !declares {
            continue;
        }
        let mut j = next_solid(tokens, i);
        // `var<storage, read_write> name`
        if t.text == "var" && j.is_some_and(|j| tokens[j].text == "<") {
            let mut k = j.unwrap_or(i);
            while k < tokens.len() && tokens[k].text != ">" {
                k += 1;
            }
            j = next_solid(tokens, k);
        }
        if let Some(j) = j.filter(|&j| tokens[j].kind == Kind::Ident) {
            names.push(tokens[j].text.to_string());
        }
    }
    names
}

/// The names of the override constants.
fn override_names(tokens: &[Token<'_>]) -> Vec<String> {
    module_scope(tokens)
        .into_iter()
        .filter(|&i| tokens[i].text == "override")
        .filter_map(|i| next_solid(tokens, i))
        .map(|j| tokens[j].text.to_string())
        .collect()
}

/// The tokens joined, every declared name given `sfx`, except after a `.` and where a
/// struct declares its members.
fn rename(tokens: &[Token<'_>], declared: &[String], sfx: &str) -> String {
    let mut out = String::new();
    let mut depth = 0i32;
    // The brace depth of the struct body we are in, if any.
    let mut struct_body: Option<i32> = None;
    let mut pending_struct = false;
    for (i, t) in tokens.iter().enumerate() {
        match t.text {
            "struct" if t.kind == Kind::Ident => pending_struct = true,
            "{" => {
                depth += 1;
                if pending_struct {
                    struct_body = Some(depth);
                    pending_struct = false;
                }
            }
            "}" => {
                if struct_body == Some(depth) {
                    struct_body = None;
                }
                depth -= 1;
            }
            _ => {}
        }
        out.push_str(t.text);
        if t.kind != Kind::Ident || !declared.iter().any(|d| d == t.text) {
            continue;
        }
        let after_dot = prev_solid(tokens, i).is_some_and(|j| tokens[j].text == ".");
        let member_decl = struct_body == Some(depth)
            && next_solid(tokens, i).is_some_and(|j| tokens[j].text == ":");
        if !after_dot && !member_decl {
            out.push_str(sfx);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "enable f16;
// a comment naming x
struct P { x: u32, n: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
override WG: u32 = 8u; /* block /* nested */ */
const K = 0x0f0fu;
fn n(v: vec4<f32>) -> f32 { let x = v.x + f32(p.x); return x * 2.5e-3; }
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    x[wid.x * WG + l] = n(vec4<f32>(f32(p.n))) + f32(K);
}
";

    #[test]
    fn a_kernel_is_renamed_and_its_entry_lifted() {
        let k = link(KERNEL, 1, 32).unwrap();
        assert_eq!(k.entry, "main_ch1");
        assert_eq!(k.builtins, ["workgroup_id", "local_invocation_index"]);
        assert_eq!(k.workgroup_size, "WG_ch1");
        assert_eq!(k.directives, ["enable f16;"]);
        assert_eq!(k.overrides, [("WG".to_string(), "WG_ch1".to_string())]);
        let b = &k.body;
        for want in [
            "struct P_ch1 { x: u32, n: u32 }",
            "@group(0) @binding(32) var<uniform> p_ch1: P_ch1;",
            "@group(0) @binding(33) var<storage, read_write> x_ch1: array<f32>;",
            "override WG_ch1: u32 = 8u;",
            "const K_ch1 = 0x0f0fu;",
            "fn n_ch1(v: vec4<f32>) -> f32 { let x_ch1 = v.x + f32(p_ch1.x); return x_ch1 * 2.5e-3; }",
            "fn main_ch1(wid: vec3<u32>, l: u32) {",
            "x_ch1[wid.x * WG_ch1 + l] = n_ch1(vec4<f32>(f32(p_ch1.n))) + f32(K_ch1);",
        ] {
            assert!(b.contains(want), "{want} not in:\n{b}");
        }
        assert!(!b.contains("@compute") && !b.contains("@builtin") && !b.contains("comment"));
        assert!(!b.contains("enable"), "{b}");
    }

    #[test]
    fn kernels_that_cannot_be_joined_are_refused() {
        let cases = [
            (
                format!("{KERNEL}@compute @workgroup_size(1) fn other() {{}}\n"),
                "more than one @compute",
            ),
            (KERNEL.replace("fn main(", "fn go("), "not named main"),
            (
                format!("{KERNEL}const K_ch0 = 1u;\n"),
                "K_ch0 is declared already",
            ),
            (
                KERNEL.replace("@group(0) @binding(1)", "@group(1) @binding(1)"),
                "outside group 0",
            ),
        ];
        for (src, want) in cases {
            let e = link(&src, 0, 0).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn uniforms_are_read_through_an_index() {
        let src = "struct P { a: u32, b: u32, c: u32, d: u32 }\n@group(0) @binding(0) var<uniform> p: P;\n@group(0) @binding(1) var<storage, read_write> x: array<u32>;\nfn f() -> u32 { return p.a + x[p.b]; }\n";
        let out = index_uniforms(src, "zero");
        assert!(out.contains("var<uniform> p: array<P, 1>;"), "{out}");
        assert!(out.contains("return p[zero].a + x[p[zero].b];"), "{out}");
        let module = format!("var<private> zero: u32;\n{out}");
        naga::front::wgsl::parse_str(&module).unwrap();
    }

    #[test]
    fn the_renamed_kernel_is_valid_wgsl() {
        let k = link(KERNEL, 2, 64).unwrap();
        let src = format!("{}\n{}", k.directives.join("\n"), k.body);
        let module = naga::front::wgsl::parse_str(&src).unwrap();
        assert!(module.entry_points.is_empty());
        assert!(module
            .functions
            .iter()
            .any(|(_, f)| f.name.as_deref() == Some("main_ch2")));
    }
}
