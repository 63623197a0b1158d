//! How a sample reads into the serde type a schema entry names, and which fields that type
//! writes or skips: what [`super::check`] holds [`super::schema`] against.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::ser::{self, Impossible, Serialize};
use serde_json::{Value, json};

/// What serde made of a sample: the JSON it writes back, and the fields it wrote or skipped.
pub struct Probed {
    pub json: Value,
    pub fields: Vec<String>,
}

/// Reads a sample into the serde type a schema entry describes, and writes it back.
#[derive(Clone, Copy)]
pub struct Probe(pub fn(&Value) -> Result<Probed, String>);

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Probe")
    }
}

pub fn probe<T: Serialize + DeserializeOwned>(value: &Value) -> Result<Probed, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let json = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut tracer = FieldTracer::default();
    typed.serialize(&mut tracer).map_err(|e| e.0)?;
    Ok(Probed {
        json,
        fields: tracer.fields,
    })
}

/// A struct variant of an externally tagged enum (`{"gap": {...}}`), as if it were a struct.
pub fn probe_variant<T: Serialize + DeserializeOwned>(
    variant: &str,
    value: &Value,
) -> Result<Probed, String> {
    let probed = probe::<T>(&json!({ variant: value }))?;
    Ok(Probed {
        json: probed.json[variant].clone(),
        fields: probed.fields,
    })
}

/// Records the names of the fields a value's `Serialize` writes or skips, at the top level.
#[derive(Default)]
struct FieldTracer {
    fields: Vec<String>,
}

#[derive(Debug)]
struct TraceError(String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl ser::Error for TraceError {
    fn custom<T: fmt::Display>(message: T) -> TraceError {
        TraceError(message.to_string())
    }
}

type Done = Result<(), TraceError>;

impl ser::Serializer for &mut FieldTracer {
    type Ok = ();
    type Error = TraceError;
    type SerializeSeq = Impossible<(), TraceError>;
    type SerializeTuple = Impossible<(), TraceError>;
    type SerializeTupleStruct = Impossible<(), TraceError>;
    type SerializeTupleVariant = Impossible<(), TraceError>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, _: bool) -> Done {
        Ok(())
    }
    fn serialize_i8(self, _: i8) -> Done {
        Ok(())
    }
    fn serialize_i16(self, _: i16) -> Done {
        Ok(())
    }
    fn serialize_i32(self, _: i32) -> Done {
        Ok(())
    }
    fn serialize_i64(self, _: i64) -> Done {
        Ok(())
    }
    fn serialize_u8(self, _: u8) -> Done {
        Ok(())
    }
    fn serialize_u16(self, _: u16) -> Done {
        Ok(())
    }
    fn serialize_u32(self, _: u32) -> Done {
        Ok(())
    }
    fn serialize_u64(self, _: u64) -> Done {
        Ok(())
    }
    fn serialize_f32(self, _: f32) -> Done {
        Ok(())
    }
    fn serialize_f64(self, _: f64) -> Done {
        Ok(())
    }
    fn serialize_char(self, _: char) -> Done {
        Ok(())
    }
    fn serialize_str(self, _: &str) -> Done {
        Ok(())
    }
    fn serialize_bytes(self, _: &[u8]) -> Done {
        Ok(())
    }
    fn serialize_none(self) -> Done {
        Ok(())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Done {
        Ok(())
    }
    fn serialize_unit(self) -> Done {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, value: &T) -> Done {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Done {
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, TraceError> {
        Err(ser::Error::custom("a sequence is no object"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, TraceError> {
        Err(ser::Error::custom("a tuple is no object"))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, TraceError> {
        Err(ser::Error::custom("a tuple is no object"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, TraceError> {
        Err(ser::Error::custom("a tuple is no object"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, TraceError> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, TraceError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, TraceError> {
        Ok(self)
    }
}

impl FieldTracer {
    fn record(&mut self, key: &str) -> Done {
        self.fields.push(key.to_owned());
        Ok(())
    }
}

/// A struct and a struct variant are traced alike: each field written or skipped.
macro_rules! trace_fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for &mut FieldTracer {
            type Ok = ();
            type Error = TraceError;
            fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, _: &T) -> Done {
                self.record(key)
            }
            fn skip_field(&mut self, key: &'static str) -> Done {
                self.record(key)
            }
            fn end(self) -> Done {
                Ok(())
            }
        }
    )*};
}

trace_fields!(SerializeStruct, SerializeStructVariant);

/// A unit variant of an internally tagged enum is written as a map of its tag alone.
impl ser::SerializeMap for &mut FieldTracer {
    type Ok = ();
    type Error = TraceError;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, _: &T) -> Done {
        Ok(())
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, _: &T) -> Done {
        Ok(())
    }
    fn serialize_entry<K: ?Sized + Serialize, V: ?Sized + Serialize>(
        &mut self,
        key: &K,
        _: &V,
    ) -> Done {
        let key = serde_json::to_value(key).map_err(ser::Error::custom)?;
        self.record(key.as_str().unwrap_or_default())
    }
    fn end(self) -> Done {
        Ok(())
    }
}
