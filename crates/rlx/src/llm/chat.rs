//! Chat prompts. Like llama.cpp, RLX recognises the common template families from the Jinja
//! text stored in `tokenizer.chat_template` instead of running Jinja.

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
