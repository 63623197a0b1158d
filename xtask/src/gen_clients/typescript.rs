//! `clients/typescript/src/types.gen.ts`: interfaces, and their codecs (`codec.ts`).

use std::fmt::Write as _;

use super::schema::{Enum, Field, ITEMS, Item, Presence, Struct, Ty, Union, enum_named};
use super::{HEADER, lower_camel, union_fields, upper_snake};

pub fn emit() -> String {
    let mut out = format!(
        "// {HEADER}.\n// The protocol's objects (docs/protocol.md §2, §5, §12, §14), with the wire's field names.\n\n\
         import {{ type Codec, arrayOf, bool, defaulted, int, nullable, object, oneOf, optional, recordOf, required, str, tagged }} from \"./codec.js\";\n"
    );
    for item in ITEMS {
        match item {
            Item::Enum(e) => emit_enum(&mut out, e),
            Item::Struct(s) => emit_struct(&mut out, s),
            Item::Union(u) if enum_named(u.kinds).is_some_and(|k| k.open) => {
                emit_open_union(&mut out, u)
            }
            Item::Union(u) => emit_closed_union(&mut out, u),
        }
    }
    out
}

fn doc(out: &mut String, indent: &str, text: &str) {
    if !text.is_empty() {
        let _ = writeln!(out, "{indent}/** {text} */");
    }
}

/// The name of a type in TypeScript, where `Event` would shadow the DOM's.
fn ts_name(name: &str) -> &str {
    if name == "Event" {
        "LivenessEvent"
    } else {
        name
    }
}

/// The name of a type's codec, where `process` would shadow Node's global.
fn codec_name(name: &str) -> String {
    match lower_camel(name) {
        codec if codec == "process" => "process_".into(),
        codec => codec,
    }
}

fn emit_enum(out: &mut String, e: &Enum) {
    let list = upper_snake(e.list);
    let values: Vec<String> = e.values.iter().map(|(_, v, _)| format!("{v:?}")).collect();
    let _ = write!(
        out,
        "\n/** Every {}, in the daemon's order. */\nexport const {list} = [{}] as const;\n",
        e.name,
        values.join(", ")
    );
    doc(out, "", e.doc);
    if e.open {
        let _ = writeln!(
            out,
            "export type {} = (typeof {list})[number] | (string & {{}});\nexport const {} = str as Codec<{}>;",
            e.name,
            codec_name(e.name),
            e.name
        );
    } else {
        let _ = writeln!(
            out,
            "export type {} = (typeof {list})[number];\nexport const {} = oneOf<{}>(...{list});",
            e.name,
            codec_name(e.name),
            e.name
        );
    }
    if e.consts {
        for (_, value, text) in e.values {
            doc(out, "", text);
            let _ = writeln!(
                out,
                "export const {} = {value:?};",
                value.replace('.', "_").to_uppercase()
            );
        }
    }
}

fn ts_type(ty: Ty) -> String {
    match ty {
        Ty::Bool => "boolean".into(),
        Ty::U8 | Ty::U32 | Ty::U64 | Ty::I64 => "number".into(),
        Ty::Str => "string".into(),
        Ty::List(item) => format!("{}[]", ts_type(*item)),
        Ty::Map(value) => format!("Record<string, {}>", ts_type(*value)),
        Ty::Named(name) => ts_name(name).into(),
    }
}

fn codec(ty: Ty) -> String {
    match ty {
        Ty::Bool => "bool".into(),
        Ty::U8 | Ty::U32 | Ty::U64 | Ty::I64 => "int".into(),
        Ty::Str => "str".into(),
        Ty::List(item) => format!("arrayOf({})", codec(*item)),
        Ty::Map(value) => format!("recordOf({})", codec(*value)),
        Ty::Named(name) => codec_name(name),
    }
}

fn member(out: &mut String, f: &Field, presence: Presence) {
    doc(out, "  ", f.doc);
    let ty = ts_type(f.ty);
    let _ = match presence {
        Presence::Nullable => writeln!(out, "  {}: {ty} | null;", f.name),
        Presence::Optional => writeln!(out, "  {}?: {ty};", f.name),
        Presence::Required | Presence::Default { .. } => writeln!(out, "  {}: {ty};", f.name),
    };
}

fn field_codec(f: &Field, presence: Presence) -> String {
    let c = codec(f.ty);
    match presence {
        Presence::Required => format!("required({c})"),
        Presence::Nullable => format!("nullable({c})"),
        Presence::Optional => format!("optional({c})"),
        Presence::Default { value, omit: false } => format!("defaulted({c}, {value})"),
        Presence::Default { value, omit: true } => format!("defaulted({c}, {value}, true)"),
    }
}

fn codec_fields(
    fields: &[&Field],
    kind: Option<String>,
    presence: impl Fn(&Field) -> Presence,
) -> String {
    let mut entries: Vec<String> = kind.into_iter().map(|k| format!("kind: {k}")).collect();
    entries.extend(
        fields
            .iter()
            .map(|f| format!("{}: {}", f.name, field_codec(f, presence(f)))),
    );
    entries.join(", ")
}

fn emit_struct(out: &mut String, s: &Struct) {
    let name = ts_name(s.name);
    out.push('\n');
    doc(out, "", s.doc);
    let _ = writeln!(out, "export interface {name} {{");
    for f in s.fields {
        // What clients send may leave out what the daemon leaves out.
        let presence = match f.presence {
            Presence::Default { omit: true, .. } if s.strict => Presence::Optional,
            presence => presence,
        };
        member(out, f, presence);
    }
    out.push_str("}\n");
    let fields: Vec<&Field> = s.fields.iter().collect();
    let _ = writeln!(
        out,
        "export const {}: Codec<{name}> = object<{name}>({{ {} }}{});",
        codec_name(s.name),
        codec_fields(&fields, None, |f| f.presence),
        if s.strict { ", true" } else { "" }
    );
}

/// A union a newer daemon may extend: one interface, its fields optional but `kind`.
fn emit_open_union(out: &mut String, u: &Union) {
    let name = u.name;
    let fields = union_fields(u);
    out.push('\n');
    doc(out, "", u.doc);
    let _ = writeln!(out, "export interface {name} {{\n  kind: {};", u.kinds);
    for f in &fields {
        member(out, f, Presence::Optional);
    }
    out.push_str("}\n");
    let _ = writeln!(
        out,
        "export const {}: Codec<{name}> = object<{name}>({{ {} }});",
        codec_name(name),
        codec_fields(
            &fields,
            Some(format!("required({})", codec_name(u.kinds))),
            |_| Presence::Optional
        )
    );
}

/// A closed union: a discriminated union of its kinds.
fn emit_closed_union(out: &mut String, u: &Union) {
    let name = u.name;
    out.push('\n');
    doc(out, "", u.doc);
    let _ = writeln!(out, "export type {name} =");
    let mut codecs = Vec::new();
    for variant in u.variants {
        let mut members = vec![format!("kind: {:?}", variant.kind)];
        for f in variant.fields {
            let optional = if f.presence == Presence::Required {
                ""
            } else {
                "?"
            };
            members.push(format!("{}{optional}: {}", f.name, ts_type(f.ty)));
        }
        let _ = writeln!(out, "  | {{ {} }}", members.join("; "));
        let fields: Vec<&Field> = variant.fields.iter().collect();
        codecs.push(format!(
            "  {}: object<Extract<{name}, {{ kind: {:?} }}>>({{ {} }}),",
            variant.kind,
            variant.kind,
            codec_fields(
                &fields,
                Some(format!("required(oneOf({:?}))", variant.kind)),
                |f| f.presence
            )
        ));
    }
    out.pop();
    out.push_str(";\n");
    let _ = writeln!(
        out,
        "export const {}: Codec<{name}> = tagged<{name}>({:?}, {{\n{}\n}});",
        codec_name(name),
        name,
        codecs.join("\n")
    );
}
