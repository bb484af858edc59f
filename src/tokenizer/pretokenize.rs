//! Pre-tokenization for byte-level BPE: split text into words before merges run.
//!
//! Each `tokenizer.ggml.pre` name selects a list of regexes applied one after another, each
//! refining the pieces of the previous one (a piece boundary is never crossed). Two regexes
//! are hand-written here for speed and exactness (GPT-2's and Llama 3's); the others run on
//! `fancy_regex` in the way llama.cpp runs them on `std::regex`:
//!
//! - a regex that names Unicode classes (`\p{L}`, `\p{N}`, …) runs on a "collapsed" text in
//!   which every non-ASCII code point is replaced by one stand-in character per class
//!   (non-ASCII whitespace by U+000B), with each `\p{X}` rewritten into a class holding the
//!   stand-in plus the ASCII members;
//! - any other regex runs on the code points themselves, non-ASCII whitespace again as U+000B.
//!
//! Positions are counted in code points; invalid UTF-8 bytes are U+FFFD (see `unicode.rs`).

use fancy_regex::Regex;

use super::unicode::{cpts_from_utf8, push_utf8, CptFlags, MAX_CODEPOINTS};
use crate::{Error, Result};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The case-insensitive spelling of the Llama 3 regex, also recognised as that splitter.
const LLAMA3_CI: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3_MAIN: &str = "[!\\\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const PORO: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";

/// Per pre-tokenizer settings that llama.cpp ties to the `tokenizer.ggml.pre` name.
pub(crate) struct PreSettings {
    pub regexes: Vec<&'static str>,
    /// A word that is itself a vocab entry is emitted whole, without running merges.
    pub ignore_merges: bool,
    /// BOS default before `tokenizer.ggml.add_bos_token` is read.
    pub add_bos: bool,
}

/// The settings for a BPE vocab's `tokenizer.ggml.pre` (absent means "default").
pub(crate) fn pre_settings(pre: Option<&str>) -> Result<PreSettings> {
    let name = pre.unwrap_or("default");
    let s = |regexes: Vec<&'static str>| PreSettings {
        regexes,
        ignore_merges: false,
        add_bos: false,
    };
    let settings = match name {
        "default" => s(vec![
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2,
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreSettings {
            regexes: vec![LLAMA3],
            ignore_merges: true,
            add_bos: true,
        },
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => s(vec![LLAMA3]),
        "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
        | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code"
        | "roberta-bpe" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion" | "granite-docling" => {
            s(vec![GPT2])
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => s(vec![r"\p{N}", GPT2]),
        "falcon" => s(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" | "grok-2" => s(vec![QWEN2]),
        "qwen35" => s(vec![QWEN35]),
        "poro-chat" | "bloom" | "gpt3-finnish" => s(vec![PORO]),
        "viking" => s(vec![PORO, r"\p{N}"]),
        "tekken" => PreSettings {
            regexes: vec![TEKKEN],
            ignore_merges: true,
            add_bos: true,
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => s(vec![GPT4O]),
        "seed-coder" => s(vec![SEED_CODER]),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => s(vec![BAILINGMOE]),
        "deepseek-coder" => s(vec![
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ]),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            s(vec![r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_MAIN])
        }
        "chameleon" => PreSettings {
            regexes: vec![
                "<sentinel:[0-9]+>",
                "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                "([\\t\\n]|    |  )",
                r"\p{N}",
                r"[\p{P}!-/:-@\[-`{-~]",
                GPT2,
            ],
            ignore_merges: false,
            add_bos: true,
        },
        other => {
            return Err(Error::Unsupported(format!(
                "BPE pre-tokenizer '{other}' (tokenizer.ggml.pre)"
            )))
        }
    };
    Ok(settings)
}

/// One compiled regex stage.
enum Stage {
    Gpt2,
    Llama3,
    /// `collapsed`: runs on the class-collapsed text (the regex named `\p{..}` classes).
    Regex {
        re: Regex,
        collapsed: bool,
    },
}

/// A compiled list of split stages.
pub(crate) struct PreTokenizer {
    stages: Vec<Stage>,
}

impl PreTokenizer {
    pub fn new(regexes: &[&str]) -> Result<PreTokenizer> {
        let stages = regexes
            .iter()
            .map(|expr| compile_stage(expr))
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer { stages })
    }

    /// Splits `text` into words, each re-encoded as UTF-8 from its code points (invalid
    /// input bytes come out as U+FFFD).
    pub fn split(&self, text: &[u8]) -> Result<Vec<Vec<u8>>> {
        let cpts = cpts_from_utf8(text);
        if let Some(bad) = cpts.iter().find(|&&c| c >= MAX_CODEPOINTS) {
            return Err(Error::Tokenizer(format!(
                "input decodes to code point U+{bad:X}, beyond U+10FFFF"
            )));
        }
        let mut offsets = vec![cpts.len()];
        let mut collapsed: Option<IndexedText> = None;
        let mut wide: Option<IndexedText> = None;
        for stage in &self.stages {
            offsets = match stage {
                Stage::Gpt2 => split_gpt2(&cpts, &offsets),
                Stage::Llama3 => split_llama3(&cpts, &offsets),
                Stage::Regex {
                    re,
                    collapsed: true,
                } => {
                    let t = collapsed.get_or_insert_with(|| IndexedText::collapsed(&cpts));
                    split_regex(re, t, &offsets)?
                }
                Stage::Regex {
                    re,
                    collapsed: false,
                } => {
                    let t = wide.get_or_insert_with(|| IndexedText::wide(&cpts));
                    split_regex(re, t, &offsets)?
                }
            };
        }
        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for len in offsets {
            let mut w = Vec::with_capacity(len);
            for &c in &cpts[start..start + len] {
                push_utf8(&mut w, c)?;
            }
            words.push(w);
            start += len;
        }
        Ok(words)
    }
}

fn compile_stage(expr: &str) -> Result<Stage> {
    if expr == GPT2 {
        return Ok(Stage::Gpt2);
    }
    if expr == LLAMA3 || expr == LLAMA3_CI {
        return Ok(Stage::Llama3);
    }
    let collapsed = uses_categories(expr);
    let pattern = if collapsed {
        collapse_regex(expr)?
    } else {
        expr.to_string()
    };
    let pattern = ascii_shorthands(&pattern);
    let re = Regex::new(&pattern).map_err(|e| {
        Error::Tokenizer(format!("cannot compile pre-tokenizer regex {expr:?}: {e}"))
    })?;
    Ok(Stage::Regex { re, collapsed })
}

/// The class names the collapsed text knows, with the stand-in category of each.
const CATEGORY_NAMES: [(&str, u16); 10] = [
    (r"\p{N}", CptFlags::NUMBER),
    (r"\p{L}", CptFlags::LETTER),
    (r"\p{P}", CptFlags::PUNCTUATION),
    (r"\p{M}", CptFlags::ACCENT_MARK),
    (r"\p{S}", CptFlags::SYMBOL),
    (r"\p{Lu}", CptFlags::LETTER),
    (r"\p{Ll}", CptFlags::LETTER),
    (r"\p{Lt}", CptFlags::LETTER),
    (r"\p{Lm}", CptFlags::LETTER),
    (r"\p{Lo}", CptFlags::LETTER),
];

fn uses_categories(expr: &str) -> bool {
    CATEGORY_NAMES.iter().any(|(name, _)| expr.contains(name))
}

/// The stand-in character for a category in the collapsed text (U+00D0 for the rest).
fn stand_in(category: u16) -> char {
    match category {
        CptFlags::NUMBER => '\u{D1}',
        CptFlags::LETTER => '\u{D2}',
        CptFlags::PUNCTUATION => '\u{D3}',
        CptFlags::ACCENT_MARK => '\u{D4}',
        CptFlags::SYMBOL => '\u{D5}',
        _ => '\u{D0}',
    }
}

/// ASCII members of each category, as class ranges.
fn ascii_members(category: u16) -> &'static str {
    match category {
        CptFlags::NUMBER => "0-9",
        CptFlags::LETTER => "A-Za-z",
        CptFlags::PUNCTUATION => r"!-#%-*,-/:-;?-@\[-\]_\{\}",
        CptFlags::SYMBOL => r"\$\+<->\^`\|",
        _ => "",
    }
}

/// Rewrites each `\p{X}` into a class of its stand-in plus its ASCII members (no extra
/// brackets inside an existing class).
fn collapse_regex(expr: &str) -> Result<String> {
    if !expr.is_ascii() {
        return Err(Error::Unsupported(format!(
            "pre-tokenizer regex mixes Unicode classes with non-ASCII characters: {expr:?}"
        )));
    }
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !escaped {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && !escaped {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if let Some((name, cat)) = CATEGORY_NAMES
            .iter()
            .find(|(name, _)| expr[i..].starts_with(name))
        {
            if !inside {
                out.push('[');
            }
            out.push(stand_in(*cat));
            out.push_str(ascii_members(*cat));
            if !inside {
                out.push(']');
            }
            i += name.len();
            continue;
        }
        out.push(char::from(b[i]));
        i += 1;
    }
    Ok(out)
}

/// `std::regex` (ECMAScript) reads `\d` and `\w` as ASCII classes; spell them out so the
/// Unicode-aware engine here agrees.
fn ascii_shorthands(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str("[0-9]"),
            Some('D') => out.push_str("[^0-9]"),
            Some('w') => out.push_str("[0-9A-Za-z_]"),
            Some('W') => out.push_str("[^0-9A-Za-z_]"),
            Some(n) => {
                out.push('\\');
                out.push(n);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Text with one char per code point, and the byte offset of each (plus the end).
struct IndexedText {
    text: String,
    starts: Vec<usize>,
}

impl IndexedText {
    fn from_chars(chars: impl Iterator<Item = char>) -> IndexedText {
        let mut text = String::new();
        let mut starts = Vec::new();
        for ch in chars {
            starts.push(text.len());
            text.push(ch);
        }
        starts.push(text.len());
        IndexedText { text, starts }
    }

    fn collapsed(cpts: &[u32]) -> IndexedText {
        IndexedText::from_chars(cpts.iter().map(|&c| {
            if c < 128 {
                return char::from(c as u8);
            }
            let f = CptFlags::of(c);
            if f.is_whitespace() {
                '\u{0B}'
            } else {
                stand_in(f.category())
            }
        }))
    }

    fn wide(cpts: &[u32]) -> IndexedText {
        IndexedText::from_chars(cpts.iter().map(|&c| {
            if c > 0x7F && CptFlags::of(c).is_whitespace() {
                '\u{0B}'
            } else {
                char::from_u32(c).unwrap_or('\u{FFFD}')
            }
        }))
    }

    /// Code point index of a byte offset that starts a char (or is the end).
    fn cpt_index(&self, byte: usize) -> usize {
        self.starts.partition_point(|&s| s < byte)
    }
}

/// Splits every piece by the regex: matches and the gaps between them become pieces.
fn split_regex(re: &Regex, t: &IndexedText, offsets: &[usize]) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let (b0, b1) = (t.starts[start], t.starts[start + len]);
        let piece = &t.text[b0..b1];
        let mut prev = start;
        for m in re.find_iter(piece) {
            let m = m.map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex failed: {e}")))?;
            let (ms, me) = (t.cpt_index(b0 + m.start()), t.cpt_index(b0 + m.end()));
            if ms > prev {
                out.push(ms - prev);
            }
            if me > ms {
                out.push(me - ms);
            }
            prev = me;
        }
        if prev < start + len {
            out.push(start + len - prev);
        }
        start += len;
    }
    Ok(out)
}

/// "No code point here": positions outside the piece being split.
const OUT_OF_RANGE: u32 = u32::MAX;

/// One piece of the text as the hand-written splitters see it.
struct Piece<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
    prev_end: usize,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if pos >= self.ini && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> CptFlags {
        if pos >= self.ini && pos < self.end {
            CptFlags::of(self.cpts[pos])
        } else {
            CptFlags::default()
        }
    }
    /// Closes the current word at `end` (empty words are dropped).
    fn emit(&mut self, end: usize, out: &mut Vec<usize>) {
        if end > self.prev_end {
            out.push(end - self.prev_end);
        }
        self.prev_end = end;
    }
}

/// Is `'` followed by one of the English contraction suffixes? Returns its length.
fn contraction_len(p: &Piece, pos: usize, fold_case: bool) -> Option<usize> {
    let low = |c: u32| if fold_case { to_lower(c) } else { c };
    if p.cpt(pos) != u32::from(b'\'') || pos + 1 >= p.end {
        return None;
    }
    let n1 = low(p.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&c| n1 == u32::from(c)) {
        return Some(2);
    }
    if pos + 2 < p.end {
        let n2 = low(p.cpt(pos + 2));
        let pair = |a: u8, b: u8| n1 == u32::from(a) && n2 == u32::from(b);
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return Some(3);
        }
    }
    None
}

fn to_lower(c: u32) -> u32 {
    char::from_u32(c)
        .and_then(|ch| {
            let mut it = ch.to_lowercase();
            match (it.next(), it.next()) {
                (Some(l), None) => Some(u32::from(l)),
                _ => None,
            }
        })
        .unwrap_or(c)
}

/// Counts the whitespace run at `pos`; also where the last CR/LF in it ends (0 if none).
fn whitespace_run(p: &Piece, pos: usize) -> (usize, usize) {
    let mut n = 0;
    let mut last_crlf_end = 0;
    while p.flags(pos + n).is_whitespace() {
        let c = p.cpt(pos + n);
        if c == u32::from(b'\r') || c == u32::from(b'\n') {
            last_crlf_end = pos + n + 1;
        }
        n += 1;
    }
    (n, last_crlf_end)
}

fn is_other(f: CptFlags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any()
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut p = Piece {
            cpts,
            ini: start,
            end: start + len,
            prev_end: start,
        };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            if let Some(n) = contraction_len(&p, pos, false) {
                pos += n;
                p.emit(pos, &mut out);
                continue;
            }
            let space = cpt == u32::from(b' ');
            let first = if space {
                p.flags(pos + 1)
            } else {
                p.flags(pos)
            };
            // Runs of one class, with an optional leading space.
            let class: Option<fn(CptFlags) -> bool> = if first.is_letter() {
                Some(CptFlags::is_letter)
            } else if first.is_number() {
                Some(CptFlags::is_number)
            } else if is_other(first) {
                Some(is_other)
            } else {
                None
            };
            if let Some(class) = class {
                pos += usize::from(space);
                while class(p.flags(pos)) {
                    pos += 1;
                }
                p.emit(pos, &mut out);
                continue;
            }
            let (n_ws, _) = whitespace_run(&p, pos);
            if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                // \s+(?!\S): leave the last space to lead the next word.
                pos += n_ws - 1;
                p.emit(pos, &mut out);
                continue;
            }
            pos += n_ws.max(1);
            p.emit(pos, &mut out);
        }
    }
    out
}

/// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let is_crlf = |c: u32| c == u32::from(b'\r') || c == u32::from(b'\n');
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut p = Piece {
            cpts,
            ini: start,
            end: start + len,
            prev_end: start,
        };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);
            if let Some(n) = contraction_len(&p, pos, true) {
                pos += n;
                p.emit(pos, &mut out);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(is_crlf(cpt) || flags.is_number())
                && (flags.is_letter() || p.flags(pos + 1).is_letter())
            {
                pos += 1;
                while p.flags(pos).is_letter() {
                    pos += 1;
                }
                p.emit(pos, &mut out);
                continue;
            }
            // \p{N}{1,3}
            if flags.is_number() {
                let mut ini = pos;
                while p.flags(pos).is_number() {
                    pos += 1;
                    if pos - ini >= 3 {
                        p.emit(pos, &mut out);
                        ini = pos;
                    }
                }
                p.emit(pos, &mut out);
                continue;
            }
            // ?[^\s\p{L}\p{N}]+[\r\n]*  (the class test on the first char, as upstream)
            let space = cpt == u32::from(b' ');
            let mut f2 = if space { p.flags(pos + 1) } else { flags };
            if !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && flags.any() {
                pos += usize::from(space);
                while is_other(f2) {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                while is_crlf(p.cpt(pos)) {
                    pos += 1;
                }
                p.emit(pos, &mut out);
                continue;
            }
            let (n_ws, last_crlf_end) = whitespace_run(&p, pos);
            if last_crlf_end > 0 {
                // \s*[\r\n]+
                pos = last_crlf_end;
                p.emit(pos, &mut out);
                continue;
            }
            if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                p.emit(pos, &mut out);
                continue;
            }
            pos += n_ws.max(1);
            p.emit(pos, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(regexes: &[&str], text: &str) -> Vec<String> {
        let pt = PreTokenizer::new(regexes).unwrap();
        pt.split(text.as_bytes())
            .unwrap()
            .into_iter()
            .map(|w| String::from_utf8(w).unwrap())
            .collect()
    }

    #[test]
    fn gpt2_splits() {
        assert_eq!(
            words(&[GPT2], "Hello   world's 123 !!x  "),
            ["Hello", "  ", " world", "'s", " 123", " !!", "x", "  "]
        );
        assert_eq!(words(&[GPT2], "a\n\nb"), ["a", "\n", "\n", "b"]);
    }

    #[test]
    fn gpt2_hand_written_agrees_with_regex_engine() {
        // The same regex through the generic path (it names \p classes, so collapsed text).
        let generic = Regex::new(&ascii_shorthands(&collapse_regex(GPT2).unwrap())).unwrap();
        let texts = [
            "Hello   world's 123 !!x  ",
            "I'm  you're\tDON'T  \n\n x",
            "Café naïve — “curly” quotes… 3.14 -42",
            "  leading and trailing  ",
            "日本語 テキスト 123abc",
        ];
        for text in texts {
            let cpts = cpts_from_utf8(text.as_bytes());
            let t = IndexedText::collapsed(&cpts);
            let via_regex = split_regex(&generic, &t, &[cpts.len()]).unwrap();
            assert_eq!(split_gpt2(&cpts, &[cpts.len()]), via_regex, "{text:?}");
        }
    }

    #[test]
    fn llama3_hand_written_agrees_with_regex_engine() {
        let generic = Regex::new(&ascii_shorthands(&collapse_regex(LLAMA3).unwrap())).unwrap();
        let texts = [
            "Hello   world's 1234567 !!x  ",
            "I'M  you're\tDON'T  \n\n x\r\n",
            "Café naïve — “curly” quotes…\n\n\n 3.14 -42",
            "  leading and trailing  ",
            "日本語 テキスト 123abc",
            "a.\n\nb ,\n",
        ];
        for text in texts {
            let cpts = cpts_from_utf8(text.as_bytes());
            let t = IndexedText::collapsed(&cpts);
            let via_regex = split_regex(&generic, &t, &[cpts.len()]).unwrap();
            assert_eq!(split_llama3(&cpts, &[cpts.len()]), via_regex, "{text:?}");
        }
    }

    #[test]
    fn starcoder_digits_are_single_pieces() {
        assert_eq!(
            words(&[r"\p{N}", GPT2], "ab 123 x"),
            ["ab", " ", "1", "2", "3", " x"]
        );
    }

    #[test]
    fn collapse_rewrites_classes() {
        assert_eq!(collapse_regex(r"\p{N}+").unwrap(), "[\u{D1}0-9]+");
        assert_eq!(
            collapse_regex(r"[^\r\n\p{L}]").unwrap(),
            "[^\\r\\n\u{D2}A-Za-z]"
        );
        assert!(collapse_regex("\\p{L}é").is_err());
    }

    #[test]
    fn invalid_utf8_becomes_replacement_char() {
        let pt = PreTokenizer::new(&[GPT2]).unwrap();
        let w = pt.split(b"a\xffb").unwrap();
        assert_eq!(w.concat(), "a\u{FFFD}b".as_bytes());
        assert!(pt.split(b"\xf5\x80\x80\x80").is_err());
    }

    #[test]
    fn every_known_pre_compiles() {
        for pre in [
            "default",
            "llama-bpe",
            "gpt-2",
            "smollm",
            "falcon",
            "qwen2",
            "qwen35",
            "poro-chat",
            "viking",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
            "deepseek-coder",
            "deepseek-v3",
            "chameleon",
            "dbrx",
        ] {
            let s = pre_settings(Some(pre)).unwrap();
            let pt = PreTokenizer::new(&s.regexes).unwrap();
            let text = "Hello, World! 12345 don't  stop\n\n日本 ok";
            let joined = pt.split(text.as_bytes()).unwrap().concat();
            assert_eq!(joined, text.as_bytes(), "{pre}");
        }
        assert!(pre_settings(Some("no-such-pre")).is_err());
    }
}
