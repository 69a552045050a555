//! Chat prompts: the model's own Jinja template (`tokenizer.chat_template`) rendered by a real
//! template engine ([`JinjaTemplate`], minijinja), and, for models without one, the common
//! template families recognised by name ([`ChatTemplate`]).

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A recognised chat format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\n...<|im_end|>\n`, with the system prompt the template inserts when the
    /// conversation has none.
    ChatMl {
        /// Default system prompt, if the template has one.
        default_system: Option<String>,
    },
    /// Gemma: `<start_of_turn>user\n...<end_of_turn>\n`, `model` for the assistant, system text
    /// folded into the first user turn.
    Gemma,
    /// Llama 3: `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`.
    Llama3,
    /// Llama 2 / Mistral: `[INST] ... [/INST]`.
    Llama2,
}

impl ChatTemplate {
    /// Recognise `template` (the Jinja source); `arch` picks a default when there is none.
    pub fn detect(template: Option<&str>, arch: &str) -> ChatTemplate {
        let Some(t) = template else {
            return if arch.starts_with("gemma") {
                ChatTemplate::Gemma
            } else {
                ChatTemplate::ChatMl {
                    default_system: None,
                }
            };
        };
        if t.contains("<start_of_turn>") {
            ChatTemplate::Gemma
        } else if t.contains("<|start_header_id|>") {
            ChatTemplate::Llama3
        } else if t.contains("[INST]") {
            ChatTemplate::Llama2
        } else {
            let marker = "<|im_start|>system\n";
            let default_system = t.find(marker).and_then(|i| {
                let rest = &t[i + marker.len()..];
                rest.find("<|im_end|>").map(|j| rest[..j].to_string())
            });
            ChatTemplate::ChatMl {
                default_system: default_system.filter(|s| !s.contains("{{") && !s.contains("{%")),
            }
        }
    }

    /// The prompt text for `messages`, ending with the assistant's turn header.
    pub fn render(&self, messages: &[ChatMessage]) -> String {
        let mut s = String::new();
        match self {
            ChatTemplate::ChatMl { default_system } => {
                if let (Some(sys), Some(first)) = (default_system, messages.first()) {
                    if first.role != "system" {
                        s += &format!("<|im_start|>system\n{sys}<|im_end|>\n");
                    }
                }
                for m in messages {
                    s += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
                }
                s += "<|im_start|>assistant\n";
            }
            ChatTemplate::Gemma => {
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system = format!("{}\n\n", m.content);
                        continue;
                    }
                    let role = if m.role == "assistant" {
                        "model"
                    } else {
                        m.role.as_str()
                    };
                    s += &format!(
                        "<start_of_turn>{role}\n{}{}<end_of_turn>\n",
                        std::mem::take(&mut system),
                        m.content
                    );
                }
                s += "<start_of_turn>model\n";
            }
            ChatTemplate::Llama3 => {
                for m in messages {
                    s += &format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role, m.content
                    );
                }
                s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            }
            ChatTemplate::Llama2 => {
                let mut system = String::new();
                for m in messages {
                    match m.role.as_str() {
                        "system" => system = format!("<<SYS>>\n{}\n<</SYS>>\n\n", m.content),
                        "user" => {
                            s += &format!(
                                "[INST] {}{} [/INST]",
                                std::mem::take(&mut system),
                                m.content
                            )
                        }
                        _ => s += &format!(" {}</s>", m.content),
                    }
                }
            }
        }
        s
    }
}

/// A model's own chat template: the Jinja source from its metadata, rendered with minijinja
/// (with Python string methods such as `.strip()`, as Hugging Face templates use them).
pub struct JinjaTemplate {
    env: minijinja::Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JinjaTemplate").finish_non_exhaustive()
    }
}

impl JinjaTemplate {
    /// Compile `source`; `bos` and `eos` are the texts of the tokenizer's special tokens, which
    /// templates use as `bos_token` / `eos_token`. A template that does not parse is an error
    /// naming the line.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<JinjaTemplate, String> {
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("the model's chat template does not parse: {e}"))?;
        Ok(JinjaTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The prompt text for `messages`, with the assistant's turn header when
    /// `add_generation_prompt`. A template that raises (e.g. for roles it does not take) gives
    /// its message.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let msgs: Vec<std::collections::BTreeMap<&str, &str>> = messages
            .iter()
            .map(|m| [("role", m.role.as_str()), ("content", m.content.as_str())].into())
            .collect();
        let t = self.env.get_template("chat").map_err(|e| e.to_string())?;
        t.render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| format!("the model's chat template failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_inserts_the_default_system_prompt() {
        let t = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe brief<|im_end|>\n' }}{% endif %}";
        let c = ChatTemplate::detect(Some(t), "llama");
        assert_eq!(
            c,
            ChatTemplate::ChatMl {
                default_system: Some("Be brief".into())
            }
        );
        let p = c.render(&[ChatMessage::new("user", "hi")]);
        assert_eq!(p, "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn gemma_folds_the_system_prompt_into_the_first_turn() {
        let c = ChatTemplate::detect(None, "gemma3");
        let p = c.render(&[
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", "hi"),
        ]);
        assert_eq!(
            p,
            "<start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
