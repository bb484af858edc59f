//! Checks that a Rust parameter block and the WGSL struct it mirrors agree, for the
//! tests beside each op.
//!
//! A kernel's parameters are written by the host as the bytes of a `#[repr(C)]` struct
//! and read by the shader through a struct of its own; nothing but these checks ties
//! the two. [`wgsl_mirror!`] names the Rust type, the shader file and struct, and which
//! Rust field (a path, for nested structs) each WGSL member is. naga lays the WGSL
//! struct out, and the check fails where a member is missing on either side, sits at
//! another offset or has another type, or the two sizes differ. Members whose names
//! start with `_` are padding and may be anything. [`check_const`] does the same for
//! a constant that both sides spell out.

use naga::{ArraySize, Scalar, ScalarKind, TypeInner, VectorSize};

/// One WGSL member's Rust side: its offset and its type's name.
pub struct Field {
    pub wgsl: &'static str,
    pub offset: usize,
    pub rust_type: &'static str,
}

/// The name of the type of the field that `_get` reads from a `T`.
pub fn field_type<T, F>(_get: fn(&T) -> &F) -> &'static str {
    std::any::type_name::<F>()
}

/// Panic, saying what differs, unless the struct `name` of `shaders/{file}` has exactly
/// the members `fields` lists (padding aside) at their offsets and with their types,
/// and is `size` bytes long.
pub fn check_mirror(rust: &str, size: usize, file: &str, name: &str, fields: &[Field]) {
    let (path, text) = shader_text(file);
    let src = struct_source(&text, name).unwrap_or_else(|| panic!("{path}: no struct {name}"));
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{path}: struct {name}: {}", e.emit_to_string(src)));
    let (members, span) = module
        .types
        .iter()
        .find_map(|(_, t)| match &t.inner {
            TypeInner::Struct { members, span } if t.name.as_deref() == Some(name) => {
                Some((members, *span))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{path}: struct {name} did not parse as a struct"));
    let at = format!("{rust} against {name} in shaders/{file}");
    for m in members {
        let wgsl = m.name.as_deref().unwrap_or("");
        if wgsl.starts_with('_') {
            continue;
        }
        let f = fields.iter().find(|f| f.wgsl == wgsl);
        let f = f.unwrap_or_else(|| panic!("{at}: WGSL member `{wgsl}` has no Rust field"));
        let wgsl_type = rust_spelling(&module, m.ty);
        assert_eq!(f.offset, m.offset as usize, "{at}: offset of `{wgsl}`");
        assert_eq!(f.rust_type, wgsl_type, "{at}: type of `{wgsl}`");
    }
    for f in fields {
        let found = members.iter().any(|m| m.name.as_deref() == Some(f.wgsl));
        assert!(
            found,
            "{at}: Rust field for `{}` has no WGSL member",
            f.wgsl
        );
    }
    assert_eq!(size, span as usize, "{at}: size");
}

/// Panic unless `shaders/{file}` declares `const name` with the value `value`.
pub fn check_const(file: &str, name: &str, value: u64) {
    let (path, text) = shader_text(file);
    let decl = format!("const {name}:");
    let line = text.lines().find(|l| l.trim_start().starts_with(&decl));
    let line = line.unwrap_or_else(|| panic!("{path}: no `{decl}`"));
    let literal = line
        .split('=')
        .nth(1)
        .map(|v| v.trim().trim_end_matches(';'));
    let parsed = literal.and_then(|v| v.trim_end_matches('u').parse::<u64>().ok());
    assert_eq!(
        parsed,
        Some(value),
        "{path}: `{}` against the host's {value}",
        line.trim()
    );
}

/// `shaders/{file}`'s path and text.
fn shader_text(file: &str) -> (String, String) {
    let path = format!("{}/shaders/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (path, text)
}

/// The text of `struct name { ... }` in `text` (WGSL struct bodies hold no braces).
fn struct_source<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("struct {name} {{"))?;
    let end = start + text[start..].find('}')? + 1;
    Some(&text[start..end])
}

/// A WGSL type as Rust spells its mirror: scalars by name, vectors and fixed arrays
/// as arrays (`vec4<u32>` is `[u32; 4]`).
fn rust_spelling(module: &naga::Module, ty: naga::Handle<naga::Type>) -> String {
    match &module.types[ty].inner {
        TypeInner::Scalar(s) => scalar(*s).to_string(),
        TypeInner::Vector { size, scalar: s } => {
            let n = match size {
                VectorSize::Bi => 2,
                VectorSize::Tri => 3,
                VectorSize::Quad => 4,
            };
            format!("[{}; {n}]", scalar(*s))
        }
        TypeInner::Array {
            base,
            size: ArraySize::Constant(n),
            ..
        } => format!("[{}; {n}]", rust_spelling(module, *base)),
        other => format!("{other:?}"),
    }
}

fn scalar(s: Scalar) -> &'static str {
    match (s.kind, s.width) {
        (ScalarKind::Uint, 4) => "u32",
        (ScalarKind::Sint, 4) => "i32",
        (ScalarKind::Float, 4) => "f32",
        _ => "an unmirrored scalar",
    }
}

/// Check that a `#[repr(C)]` Rust type mirrors a WGSL struct (see the module's text):
/// `wgsl_mirror!(Type, "file under shaders/", "WGSL struct", { member, member: rust.path })`,
/// where a bare member is a Rust field of the same name.
macro_rules! wgsl_mirror {
    ($ty:ty, $file:expr, $name:expr, { $($wgsl:ident $(: $($path:ident).+)?),* $(,)? }) => {
        $crate::gpu::wgsl_layout::check_mirror(
            std::any::type_name::<$ty>(),
            std::mem::size_of::<$ty>(),
            $file,
            $name,
            &[$($crate::gpu::wgsl_layout::mirror_field!($ty, $wgsl $(: $($path).+)?)),*],
        )
    };
}

/// One [`Field`] of [`wgsl_mirror!`].
macro_rules! mirror_field {
    ($ty:ty, $wgsl:ident) => {
        $crate::gpu::wgsl_layout::mirror_field!($ty, $wgsl: $wgsl)
    };
    ($ty:ty, $wgsl:ident: $($path:ident).+) => {
        $crate::gpu::wgsl_layout::Field {
            wgsl: stringify!($wgsl),
            offset: std::mem::offset_of!($ty, $($path).+),
            rust_type: $crate::gpu::wgsl_layout::field_type::<$ty, _>(|v| &v.$($path).+),
        }
    };
}

pub(crate) use {mirror_field, wgsl_mirror};

#[cfg(test)]
mod tests {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Inner {
        b: f32,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Outer {
        a: u32,
        inner: Inner,
        v: [u32; 4],
        _pad: [u32; 2],
    }

    #[test]
    fn finds_the_struct_among_others() {
        let text = "struct A { x: u32, }\nstruct B {\n  y: f32,\n}\nfn f() {}";
        assert_eq!(
            super::struct_source(text, "B"),
            Some("struct B {\n  y: f32,\n}")
        );
        assert_eq!(super::struct_source(text, "C"), None);
    }

    #[test]
    fn constants_are_read() {
        super::check_const("common/w_texture.wgsl", "TEX_SHIFT", 12);
    }

    #[test]
    #[should_panic(expected = "against the host's 11")]
    fn a_constant_of_another_value_fails() {
        super::check_const("common/w_texture.wgsl", "TEX_SHIFT", 11);
    }

    #[test]
    fn a_real_mirror_passes() {
        // common/step.wgsl's Step is mirrored by ops::StepInfo.
        wgsl_mirror!(crate::ops::StepInfo, "common/step.wgsl", "Step", { n_tokens, pos, n_kv });
    }

    #[test]
    #[should_panic(expected = "offset of `pos`")]
    fn a_member_at_another_offset_fails() {
        // Step's `pos` is its second word; Outer's `v` is its third.
        wgsl_mirror!(Outer, "common/step.wgsl", "Step", {
            n_tokens: a,
            pos: v,
            n_kv: inner.b,
        });
    }

    #[test]
    #[should_panic(expected = "type of `pos`")]
    fn a_member_of_another_type_fails() {
        wgsl_mirror!(Outer, "common/step.wgsl", "Step", {
            n_tokens: a,
            pos: inner.b,
            n_kv: a,
        });
    }

    #[test]
    #[should_panic(expected = "WGSL member `n_kv` has no Rust field")]
    fn an_unlisted_member_fails() {
        wgsl_mirror!(crate::ops::StepInfo, "common/step.wgsl", "Step", { n_tokens, pos });
    }

    #[test]
    #[should_panic(expected = ": size")]
    fn another_size_fails() {
        // Step's three members and its padding word, and more.
        #[repr(C)]
        struct Long {
            n_tokens: u32,
            pos: u32,
            n_kv: u32,
            _more: [u32; 5],
        }
        wgsl_mirror!(Long, "common/step.wgsl", "Step", { n_tokens, pos, n_kv });
    }
}
