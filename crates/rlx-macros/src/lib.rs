//! Procedural macros of RLX, used through `rlx::macros` (see its documentation for examples and
//! for the misuses the macro refuses).
//!
//! `#[rlx_model]` turns a function that builds a graph into a function returning a lazily
//! compiled model (`rlx::macros::LazyModel`): the graph is built and compiled on first use and
//! the compiled program is kept for every later call.

#![deny(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_macro_input, FnArg, ItemFn, LitInt, LitStr, Pat, ReturnType, Type};

/// The attribute's options.
struct Options {
    device: proc_macro2::TokenStream,
    threads: Option<LitInt>,
    precision: Option<proc_macro2::TokenStream>,
}

fn error(span: Span, msg: &str) -> TokenStream {
    syn::Error::new(span, msg).to_compile_error().into()
}

/// The `PrecisionPolicy` variant a name stands for (the names `PrecisionPolicy::from_name`
/// takes).
fn precision(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().replace('-', "_").as_str() {
        "always_f32" | "f32" => "AlwaysF32",
        "always_f16" | "f16" => "AlwaysF16",
        "always_bf16" | "bf16" => "AlwaysBf16",
        "auto_mixed" | "mixed" | "mixed_f16" => "AutoMixed",
        "auto_mixed_bf16" | "mixed_bf16" => "AutoMixedBf16",
        _ => return None,
    })
}

fn parse_options(attr: TokenStream) -> syn::Result<Options> {
    let mut o = Options {
        device: quote!(::rlx::Device::Cpu),
        threads: None,
        precision: None,
    };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("device") {
            let v: LitStr = meta.value()?.parse()?;
            o.device = match v.value().to_ascii_lowercase().as_str() {
                "cpu" => quote!(::rlx::Device::Cpu),
                "gpu" => quote!(::rlx::Device::Gpu),
                "vulkan" => quote!(::rlx::Device::Vulkan),
                _ => {
                    return Err(syn::Error::new(
                        v.span(),
                        "device must be \"cpu\", \"gpu\" or \"vulkan\"",
                    ))
                }
            };
            Ok(())
        } else if meta.path.is_ident("threads") {
            let v: LitInt = meta.value()?.parse()?;
            if v.base10_parse::<usize>()? == 0 {
                return Err(syn::Error::new(v.span(), "threads must be at least 1"));
            }
            o.threads = Some(v);
            Ok(())
        } else if meta.path.is_ident("precision") {
            let v: LitStr = meta.value()?.parse()?;
            let variant = precision(&v.value()).ok_or_else(|| {
                syn::Error::new(
                    v.span(),
                    "precision must be one of \"always_f32\", \"always_f16\", \"always_bf16\", \"auto_mixed\", \"auto_mixed_bf16\"",
                )
            })?;
            let id = syn::Ident::new(variant, v.span());
            o.precision = Some(quote!(::rlx::PrecisionPolicy::#id));
            Ok(())
        } else {
            Err(meta.error(
                "unknown #[rlx_model] option; the options are device = \"cpu\" | \"gpu\" | \"vulkan\", threads = N, precision = \"...\"",
            ))
        }
    });
    syn::parse::Parser::parse(parser, attr)?;
    Ok(o)
}

/// Whether `ty` is `&mut Graph` (any path ending in `Graph`).
fn is_graph_mut(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => match &*r.elem {
            Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Graph"),
            _ => false,
        },
        _ => false,
    }
}

/// Turn `fn name(g: &mut Graph, args...) -> rlx::Result<Outputs> { body }` into
/// `fn name(args...) -> rlx::macros::LazyModel`: calling it builds nothing; the model builds the
/// graph (running `body` once) and compiles it for the session the options describe the first
/// time it is run or its params are set, and keeps the compiled program. `Outputs` is a
/// `NodeId`, a `Vec<NodeId>` or an array of them (`rlx::macros::IntoOutputs`).
///
/// Options: `device = "cpu" | "gpu" | "vulkan"` (default cpu), `threads = N`, `precision =
/// "auto_mixed_bf16"` (any `PrecisionPolicy` name). The extra arguments are captured by value
/// (they must be `Send + 'static`), so one function can build models of several sizes.
#[proc_macro_attribute]
pub fn rlx_model(attr: TokenStream, item: TokenStream) -> TokenStream {
    let opts = match parse_options(attr) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error().into(),
    };
    let f = parse_macro_input!(item as ItemFn);
    let sig = &f.sig;
    if let Some(t) = &sig.asyncness {
        return error(
            t.span(),
            "#[rlx_model] functions cannot be async: they build a graph",
        );
    }
    if let Some(t) = &sig.constness {
        return error(t.span(), "#[rlx_model] functions cannot be const");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return error(
            sig.generics.span(),
            "#[rlx_model] functions cannot be generic: each model is one compiled graph",
        );
    }
    if matches!(sig.output, ReturnType::Default) {
        return error(
            sig.span(),
            "#[rlx_model] functions return rlx::Result of their outputs (a NodeId or Vec<NodeId>)",
        );
    }
    let mut inputs = sig.inputs.iter();
    let first_ok = match inputs.next() {
        Some(FnArg::Typed(p)) => is_graph_mut(&p.ty),
        Some(FnArg::Receiver(r)) => {
            return error(
                r.span(),
                "#[rlx_model] functions cannot be methods (no self)",
            )
        }
        None => false,
    };
    if !first_ok {
        return error(
            sig.inputs.span(),
            "#[rlx_model] functions take `&mut Graph` first: the graph they build",
        );
    }
    let mut names = Vec::new();
    let mut outer_args = Vec::new();
    for a in inputs {
        let FnArg::Typed(p) = a else {
            return error(a.span(), "#[rlx_model]: unexpected receiver");
        };
        let Pat::Ident(id) = &*p.pat else {
            return error(
                p.pat.span(),
                "#[rlx_model] arguments after the graph must be plain names (`batch: usize`)",
            );
        };
        if matches!(&*p.ty, Type::Reference(_)) {
            return error(
                p.ty.span(),
                "#[rlx_model] arguments after the graph are kept by the model until it is built: pass them by value (owned, 'static), not by reference",
            );
        }
        let (name, ty) = (&id.ident, &p.ty);
        names.push(name.clone());
        outer_args.push(quote!(#name: #ty));
    }
    let vis = &f.vis;
    let attrs = &f.attrs;
    let name = &sig.ident;
    let name_str = name.to_string();
    let inner_inputs = &sig.inputs;
    let output = &sig.output;
    let body = &f.block;
    let device = &opts.device;
    let threads = opts
        .threads
        .as_ref()
        .map(|t| quote!(let session = session.with_threads(#t);));
    let precision = opts
        .precision
        .as_ref()
        .map(|p| quote!(let session = session.with_precision(#p);));
    let span = sig.span();
    quote_spanned! {span=>
        #(#attrs)*
        #vis fn #name(#(#outer_args),*) -> ::rlx::macros::LazyModel {
            fn __rlx_build(#inner_inputs) #output #body
            let session = ::rlx::Session::new(#device);
            #threads
            #precision
            ::rlx::macros::LazyModel::new(#name_str, session, move |g: &mut ::rlx::Graph| {
                ::rlx::macros::IntoOutputs::into_outputs(__rlx_build(g, #(#names),*)?)
            })
        }
    }
    .into()
}
