//! Code point helpers shared by the pre-tokenizer and the BPE tokenizer.
//!
//! - A lenient UTF-8 decoder that mirrors llama.cpp's: each byte that does not start a
//!   well-formed sequence becomes U+FFFD, and well-formed-looking sequences are decoded
//!   without checking for overlong forms or surrogates.
//! - Code point classes (letter, number, whitespace…) as llama.cpp groups the Unicode general
//!   categories.
//! - GPT-2's byte <-> printable character table used by byte-level BPE vocabularies.

use unicode_general_category::{get_general_category, GeneralCategory as G};

use crate::{Error, Result};

/// One past the largest Unicode scalar value.
pub(crate) const MAX_CODEPOINTS: u32 = 0x11_0000;

/// Length of the UTF-8 sequence a lead byte announces, from its high nibble (continuation
/// and invalid bytes count as 1, as in llama.cpp).
pub(crate) fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// Decodes one code point at `bytes[*pos..]`; `None` when the bytes there do not form a
/// sequence (the caller substitutes U+FFFD and moves on by one byte).
fn decode_one(bytes: &[u8], pos: &mut usize) -> Option<u32> {
    let b0 = *bytes.get(*pos)?;
    let cont = |i: usize| -> Option<u32> {
        let b = *bytes.get(*pos + i)?;
        (b & 0xC0 == 0x80).then_some(u32::from(b & 0x3F))
    };
    let (cpt, len) = if b0 & 0x80 == 0 {
        (u32::from(b0), 1)
    } else if b0 & 0x40 == 0 {
        return None;
    } else if b0 & 0x20 == 0 {
        ((u32::from(b0 & 0x1F) << 6) | cont(1)?, 2)
    } else if b0 & 0x10 == 0 {
        ((u32::from(b0 & 0x0F) << 12) | (cont(1)? << 6) | cont(2)?, 3)
    } else if b0 & 0x08 == 0 {
        let c = (u32::from(b0 & 0x07) << 18) | (cont(1)? << 12) | (cont(2)? << 6) | cont(3)?;
        (c, 4)
    } else {
        return None;
    };
    *pos += len;
    Some(cpt)
}

/// Code points of `bytes`, with U+FFFD for every byte that cannot be decoded.
pub(crate) fn cpts_from_utf8(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut pos = 0;
    while pos < bytes.len() {
        match decode_one(bytes, &mut pos) {
            Some(c) => out.push(c),
            None => {
                pos += 1;
                out.push(0xFFFD);
            }
        }
    }
    out
}

/// Appends the UTF-8 encoding of `cpt` (surrogates included, as llama.cpp does); code
/// points past U+10FFFF are an error.
pub(crate) fn push_utf8(out: &mut Vec<u8>, cpt: u32) -> Result<()> {
    // Truncating casts below keep only the bits each byte carries.
    match cpt {
        0..=0x7F => out.push(cpt as u8),
        0x80..=0x7FF => {
            out.extend_from_slice(&[0xC0 | (cpt >> 6) as u8, 0x80 | (cpt & 0x3F) as u8])
        }
        0x800..=0xFFFF => out.extend_from_slice(&[
            0xE0 | (cpt >> 12) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]),
        0x1_0000..=0x10_FFFF => out.extend_from_slice(&[
            0xF0 | (cpt >> 18) as u8,
            0x80 | ((cpt >> 12) & 0x3F) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]),
        _ => {
            return Err(Error::Tokenizer(format!(
                "input decodes to code point U+{cpt:X}, beyond U+10FFFF"
            )))
        }
    }
    Ok(())
}

/// Class bits of one code point; the low byte holds exactly one category bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CptFlags(u16);

impl CptFlags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    const CATEGORY_MASK: u16 = 0x00FF;
    const WHITESPACE: u16 = 0x0100;

    /// Flags of `cpt`; empty for values past the Unicode range (and for "outside the
    /// fragment" positions the splitters ask about).
    pub fn of(cpt: u32) -> CptFlags {
        if cpt >= MAX_CODEPOINTS {
            return CptFlags(0);
        }
        let Some(ch) = char::from_u32(cpt) else {
            // Surrogates: llama.cpp's table files them with the other C* classes.
            return CptFlags(Self::CONTROL);
        };
        let cat = match get_general_category(ch) {
            G::Control | G::Format | G::PrivateUse | G::Surrogate => Self::CONTROL,
            G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter => Self::LETTER,
            G::NonspacingMark | G::SpacingMark | G::EnclosingMark => Self::ACCENT_MARK,
            G::DecimalNumber | G::LetterNumber | G::OtherNumber => Self::NUMBER,
            G::ConnectorPunctuation
            | G::DashPunctuation
            | G::OpenPunctuation
            | G::ClosePunctuation
            | G::InitialPunctuation
            | G::FinalPunctuation
            | G::OtherPunctuation => Self::PUNCTUATION,
            G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => Self::SYMBOL,
            G::SpaceSeparator | G::LineSeparator | G::ParagraphSeparator => Self::SEPARATOR,
            // Unassigned (and any category a later crate version adds).
            _ => Self::UNDEFINED,
        };
        // Unicode's White_Space property, which is what `char::is_whitespace` tests.
        let ws = if ch.is_whitespace() {
            Self::WHITESPACE
        } else {
            0
        };
        CptFlags(cat | ws)
    }

    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// Any class at all: false only for positions outside the text.
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// The single category bit (one of the `pub const`s).
    pub fn category(self) -> u16 {
        self.0 & Self::CATEGORY_MASK
    }
}

/// GPT-2's table: byte value -> the printable character that stands for it in the vocab.
/// Printable Latin-1 bytes map to themselves; the other 68 take U+0100.. in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cpt = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every value here is below U+0200, so the conversion cannot fail.
        *slot = char::from_u32(cpt).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char_table`], indexed by code point (all of them are below U+0144).
pub(crate) fn char_to_byte_table() -> Vec<Option<u8>> {
    let mut inv = vec![None; 0x144];
    for (b, ch) in byte_to_char_table().iter().enumerate() {
        if let Some(slot) = inv.get_mut(*ch as usize) {
            *slot = Some(b as u8);
        }
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_decoding_matches_llama_rules() {
        assert_eq!(
            cpts_from_utf8("aé€😀".as_bytes()),
            vec![0x61, 0xE9, 0x20AC, 0x1F600]
        );
        // Stray continuation byte and a truncated sequence: one U+FFFD per byte.
        assert_eq!(cpts_from_utf8(b"a\x80b"), vec![0x61, 0xFFFD, 0x62]);
        assert_eq!(cpts_from_utf8(b"\xE2\x82"), vec![0xFFFD, 0xFFFD]);
        assert_eq!(cpts_from_utf8(b"\xFF"), vec![0xFFFD]);
        // Overlong and surrogate forms decode without validation.
        assert_eq!(cpts_from_utf8(b"\xC0\x80"), vec![0]);
        assert_eq!(cpts_from_utf8(b"\xED\xA0\x80"), vec![0xD800]);
        assert_eq!(cpts_from_utf8(b"\xF7\xBF\xBF\xBF"), vec![0x1F_FFFF]);
    }

    #[test]
    fn utf8_encoding_round_trips_and_rejects_out_of_range() {
        for c in [0u32, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x1_0000, 0x10_FFFF] {
            let mut v = Vec::new();
            push_utf8(&mut v, c).unwrap();
            assert_eq!(cpts_from_utf8(&v), vec![c]);
        }
        assert!(push_utf8(&mut Vec::new(), 0x11_0000).is_err());
    }

    #[test]
    fn classes() {
        assert!(CptFlags::of('a' as u32).is_letter());
        assert!(CptFlags::of('é' as u32).is_letter());
        assert!(CptFlags::of('7' as u32).is_number());
        assert!(CptFlags::of('½' as u32).is_number());
        assert!(CptFlags::of(' ' as u32).is_whitespace());
        assert!(CptFlags::of('\n' as u32).is_whitespace());
        assert!(CptFlags::of(0x3000).is_whitespace());
        assert!(!CptFlags::of(0x200B).is_whitespace());
        assert_eq!(CptFlags::of('!' as u32).category(), CptFlags::PUNCTUATION);
        assert_eq!(CptFlags::of('$' as u32).category(), CptFlags::SYMBOL);
        assert_eq!(CptFlags::of(0x301).category(), CptFlags::ACCENT_MARK);
        assert_eq!(CptFlags::of(0x378).category(), CptFlags::UNDEFINED);
        assert!(!CptFlags::of(0x11_0000).any());
    }

    #[test]
    fn gpt2_byte_table() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], 'Ń');
        let inv = char_to_byte_table();
        for b in 0..=255u8 {
            assert_eq!(inv[t[b as usize] as usize], Some(b));
        }
    }
}
