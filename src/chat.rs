//! Chat prompt rendering with the model's Jinja chat template.
//!
//! GGUF files carry the Hugging Face template under `tokenizer.chat_template`; we run it
//! with MiniJinja configured as Hugging Face's renderer is (`trim_blocks`, `lstrip_blocks`,
//! loop controls, Python string methods such as `.strip()`), with the same context:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and `raise_exception`.
//! Files without a template fall back to a known one for their architecture.
//!
//! A chat session keeps its KV cache between turns: it renders the whole conversation
//! and feeds only the text past what the cache already holds ([`ChatTemplate::render_delta`]).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};

use crate::{Error, Result};

/// One conversation turn; `role` is "system", "user" or "assistant".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The name the template is stored under; errors show it.
const TEMPLATE_NAME: &str = "chat_template";

/// Gemma's turn format: roles `user` and `model`, a system message folded into the first
/// user turn followed by a blank line, contents trimmed, `<bos>` at the very start.
const GEMMA_TEMPLATE: &str = r#"{{- bos_token -}}
{%- set ns = namespace(prefix='') -%}
{%- set turns = messages -%}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set ns.prefix = messages[0]['content'] ~ '\n\n' -%}
  {%- set turns = messages[1:] -%}
{%- endif -%}
{%- for m in turns -%}
  {%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
  {{- '<start_of_turn>' ~ role ~ '\n' -}}
  {%- if loop.first -%}{{- ns.prefix -}}{%- endif -%}
  {{- m['content'] | trim -}}
  {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"#;

/// ChatML: `<|im_start|>role\ncontent<|im_end|>\n` per message.
const CHATML_TEMPLATE: &str = r#"{%- for m in messages -%}
  {{- '<|im_start|>' ~ m['role'] ~ '\n' ~ m['content'] ~ '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"#;

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// From `tokenizer.chat_template` when present, else the architecture's known template
    /// ("gemma3"/"gemma*": Gemma turns; "llama" whose BOS/EOS are ChatML's markers: ChatML),
    /// else `Error::Model`. A template that does not parse is an error naming its line.
    pub fn new(
        template_source: Option<&str>,
        arch: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self> {
        // Without the vocabulary, the special tokens are all we know it contains.
        Self::with_vocab(template_source, arch, bos_token, eos_token, |t| {
            t == bos_token || t == eos_token
        })
    }

    /// As [`ChatTemplate::new`], with `has_token` telling whether the vocabulary holds a
    /// token text; a "llama" model whose vocabulary has `<|im_start|>` and `<|im_end|>`
    /// gets ChatML.
    pub fn with_vocab(
        template_source: Option<&str>,
        arch: &str,
        bos_token: &str,
        eos_token: &str,
        has_token: impl Fn(&str) -> bool,
    ) -> Result<Self> {
        let source = match template_source {
            Some(s) => s.to_owned(),
            None => fallback_template(arch, &has_token)?.to_owned(),
        };
        let mut env = Environment::new();
        env.set_syntax(hf_syntax()?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends with the
    /// header of an assistant turn, as Hugging Face's `apply_chat_template` does.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let messages: Value = messages
            .iter()
            .map(|m| {
                minijinja::context! {
                    role => m.role.as_str(),
                    content => m.content.as_str(),
                }
            })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        tmpl.render(ctx).map_err(template_error)
    }

    /// The text to feed after a turn. `previous` is the conversation whose rendering
    /// `render(previous, false)` the KV cache already holds (it ends with the assistant's
    /// reply); `all` is that conversation plus the new messages. Returns the part of
    /// `render(all, true)` past the old text, or `Error::Invalid` when the new rendering
    /// does not start with the old one (the caller then re-processes the whole prompt).
    pub fn render_delta(&self, previous: &[Message], all: &[Message]) -> Result<String> {
        let old = self.render(previous, false)?;
        let new = self.render(all, true)?;
        match new.strip_prefix(old.as_str()) {
            Some(suffix) => Ok(suffix.to_owned()),
            None => Err(Error::invalid(
                "chat template: the new conversation's rendering does not extend the previous one",
            )),
        }
    }
}

/// Hugging Face renders chat templates with `trim_blocks` and `lstrip_blocks` on.
fn hf_syntax() -> Result<SyntaxConfig> {
    SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(template_error)
}

fn fallback_template(arch: &str, has_token: &dyn Fn(&str) -> bool) -> Result<&'static str> {
    if arch.starts_with("gemma") {
        return Ok(GEMMA_TEMPLATE);
    }
    if arch == "llama" && has_token("<|im_start|>") && has_token("<|im_end|>") {
        return Ok(CHATML_TEMPLATE);
    }
    Err(Error::model(format!(
        "no tokenizer.chat_template in the file and no known chat format for architecture '{arch}'"
    )))
}

/// The template's way to reject a conversation (e.g. roles that do not alternate).
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// One line: what went wrong, the template line, and any underlying cause.
fn template_error(e: minijinja::Error) -> Error {
    let mut msg = format!("chat template: {}", e.kind());
    if let Some(detail) = e.detail() {
        msg.push_str(": ");
        msg.push_str(detail);
    }
    if let Some(line) = e.line() {
        msg.push_str(&format!(" (line {line})"));
    }
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!("; {s}"));
        source = s.source();
    }
    Error::Model(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    const SMOLLM: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const GEMMA: &str = "models/gemma-3-270m-q4_k_m.gguf";

    /// The template stored in a model file, `None` when the file has none.
    fn file_template(path: &str) -> Option<String> {
        let f = GgufFile::open(path).expect("model file (see models/)");
        f.metadata()
            .get_str("tokenizer.chat_template")
            .expect("chat_template is a string")
            .map(str::to_owned)
    }

    /// BOS and EOS token texts from the file's vocabulary.
    fn special_tokens(path: &str) -> (String, String) {
        let f = GgufFile::open(path).expect("model file");
        let m = f.metadata();
        let tokens = m.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
        let bos = m.require_u32("tokenizer.ggml.bos_token_id").unwrap() as usize;
        let eos = m.require_u32("tokenizer.ggml.eos_token_id").unwrap() as usize;
        (tokens[bos].to_owned(), tokens[eos].to_owned())
    }

    fn conv(turns: &[(&str, &str)]) -> Vec<Message> {
        turns.iter().map(|(r, c)| Message::new(*r, *c)).collect()
    }

    #[test]
    fn smollm2_real_template_renders_chatml() {
        let src = file_template(SMOLLM).expect("SmolLM2 ships a chat template");
        let (bos, eos) = special_tokens(SMOLLM);
        assert_eq!((bos.as_str(), eos.as_str()), ("<|im_start|>", "<|im_end|>"));
        let t = ChatTemplate::new(Some(&src), "llama", &bos, &eos).unwrap();
        let msgs = conv(&[("system", "You are terse."), ("user", "What is 2+2?")]);
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nYou are terse.<|im_end|>\n\
             <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "<|im_start|>system\nYou are terse.<|im_end|>\n\
             <|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        );
        // Without a system message this template supplies its own.
        let out = t.render(&conv(&[("user", "Hi")]), true).unwrap();
        assert!(out.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
        assert!(
            out.ends_with("<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        );
    }

    /// Gemma 3's turn format: `<bos>`, system folded into the first user turn with a blank
    /// line, `model` for the assistant, trimmed contents. Uses the file's template when it
    /// carries one, else the built-in Gemma format; either must give this exact text.
    #[test]
    fn gemma3_renders_gemma_turns() {
        let src = file_template(GEMMA);
        let (bos, eos) = special_tokens(GEMMA);
        assert_eq!(bos, "<bos>");
        let t = ChatTemplate::new(src.as_deref(), "gemma3", &bos, &eos).unwrap();
        let msgs = conv(&[
            ("system", "Be brief."),
            ("user", " Hello there \n"),
            ("assistant", "Hi!"),
            ("user", "Name a color."),
        ]);
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHello there<end_of_turn>\n\
             <start_of_turn>model\nHi!<end_of_turn>\n\
             <start_of_turn>user\nName a color.<end_of_turn>\n\
             <start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&conv(&[("user", "Hi")]), false).unwrap(),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        );
    }

    #[test]
    fn fallbacks_by_architecture() {
        let msgs = conv(&[("user", "Hi"), ("assistant", "Hello"), ("user", "Bye")]);
        let chatml = ChatTemplate::new(None, "llama", "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            chatml.render(&msgs, true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n\
             <|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
        let gemma = ChatTemplate::new(None, "gemma", "<bos>", "<eos>").unwrap();
        assert_eq!(
            gemma.render(&msgs, false).unwrap(),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n"
        );
        // A vocabulary check can enable ChatML even when BOS/EOS are other tokens.
        let vocab = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];
        let t = ChatTemplate::with_vocab(None, "llama", "<s>", "</s>", |s| vocab.contains(&s));
        assert!(t.is_ok());
        // A llama model without ChatML markers, or an unknown architecture, has no fallback.
        let e = ChatTemplate::new(None, "llama", "<s>", "</s>")
            .err()
            .unwrap();
        assert!(matches!(&e, Error::Model(m) if m.contains("llama")), "{e}");
        assert!(matches!(
            ChatTemplate::new(None, "mamba", "<s>", "</s>"),
            Err(Error::Model(_))
        ));
    }

    #[test]
    fn hf_features_work() {
        // Python string methods, loop controls, trim/lstrip blocks and raise_exception.
        let src = "{% for m in messages %}\n  {% if m.role == 'skip' %}{% continue %}{% endif %}\n\
                   {{ m.content.strip().upper() }}{% if m.content.startswith(' a') %}!{% endif %}|\n\
                   {% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(Some(src), "x", "<s>", "</s>").unwrap();
        let out = t
            .render(
                &conv(&[("user", " ab "), ("skip", "no"), ("user", "c")]),
                false,
            )
            .unwrap();
        // Block tags eat their newline and indentation; text newlines stay.
        assert_eq!(out, "AB!|\nC|\n</s>");

        let src =
            "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}ok";
        let t = ChatTemplate::new(Some(src), "x", "", "").unwrap();
        assert_eq!(t.render(&conv(&[("user", "a")]), false).unwrap(), "ok");
        let e = t
            .render(&conv(&[("user", "a"), ("user", "b")]), false)
            .unwrap_err();
        assert!(
            matches!(&e, Error::Model(m) if m.contains("only one message")),
            "{e}"
        );
    }

    #[test]
    fn broken_templates_are_errors_naming_the_line() {
        // Syntax error on line 2: an unclosed block.
        let e = ChatTemplate::new(Some("ok\n{% for m in messages %}{{ m }}"), "x", "", "")
            .err()
            .unwrap();
        assert!(
            matches!(&e, Error::Model(m) if m.starts_with("chat template:")),
            "{e}"
        );
        assert!(e.to_string().contains("line"), "{e}");
        // Runtime error on line 3: calling a string.
        let t = ChatTemplate::new(Some("a\nb\n{{ bos_token() }}"), "x", "<s>", "").unwrap();
        let e = t.render(&[], false).unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
    }

    #[test]
    fn render_delta_returns_the_new_suffix() {
        let src = file_template(SMOLLM).unwrap();
        let t = ChatTemplate::new(Some(&src), "llama", "<|im_start|>", "<|im_end|>").unwrap();
        let previous = conv(&[("user", "Hi"), ("assistant", "Hello!")]);
        let mut all = previous.clone();
        all.push(Message::new("user", "How are you?"));
        assert_eq!(
            t.render_delta(&previous, &all).unwrap(),
            "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"
        );
        // The old text plus the delta is the full new prompt.
        let full = t.render(&all, true).unwrap();
        let old = t.render(&previous, false).unwrap();
        assert_eq!(
            format!("{old}{}", t.render_delta(&previous, &all).unwrap()),
            full
        );

        // Gemma: bos only once, the delta starts at the new user turn.
        let g = ChatTemplate::new(None, "gemma3", "<bos>", "<eos>").unwrap();
        assert_eq!(
            g.render_delta(&previous, &all).unwrap(),
            "<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"
        );

        // A history that was edited does not extend the old rendering.
        let edited = conv(&[("user", "Hi"), ("assistant", "Bye"), ("user", "x")]);
        assert!(matches!(
            t.render_delta(&previous, &edited),
            Err(Error::Invalid(_))
        ));
    }
}
