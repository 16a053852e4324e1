//! Schema and prefix names. They are pasted into SQL text (statements are rendered once per
//! store), so they are validated here and nowhere else: lower-case letters, digits and `_`,
//! never a quote, and short enough that every object name fits PostgreSQL's 63 bytes.

use super::StoreError;

/// The longest object-name suffix the schema uses after the prefix.
const LONGEST_SUFFIX: &str = "deliveries_event_handler_unique";
const MAX_IDENT: usize = 63;

/// Where the store lives: a validated schema name and table prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    schema: String,
    prefix: String,
    /// What holds the store: a PostgreSQL schema or a MongoDB database.
    container: &'static str,
}

impl Namespace {
    pub fn new(schema: &str, prefix: &str) -> Result<Self, StoreError> {
        check("schema", schema, MAX_IDENT)?;
        check("prefix", prefix, MAX_IDENT - LONGEST_SUFFIX.len())?;
        Ok(Self {
            schema: schema.to_owned(),
            prefix: prefix.to_owned(),
            container: "schema",
        })
    }

    /// On MongoDB: the database, whose names follow MongoDB's rules, and the prefix of every
    /// collection.
    pub fn for_mongo(database: &str, prefix: &str) -> Result<Self, StoreError> {
        check_database_name(database).map_err(|why| StoreError::InvalidIdentifier {
            what: "database".into(),
            value: database.to_owned(),
            why,
            example: "relaybus",
        })?;
        check("prefix", prefix, MAX_IDENT - LONGEST_SUFFIX.len())?;
        Ok(Self {
            schema: database.to_owned(),
            prefix: prefix.to_owned(),
            container: "database",
        })
    }

    /// The PostgreSQL schema, or the MongoDB database.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `schema` or `database`: what `--schema` names on this engine.
    pub fn container(&self) -> &'static str {
        self.container
    }

    /// Where the store lives, for messages: `schema "app", prefix "relaybus_"`.
    pub fn place(&self) -> String {
        format!(
            "{} \"{}\", prefix \"{}\"",
            self.container, self.schema, self.prefix
        )
    }

    /// Fills the `{{schema}}` and `{{prefix}}` placeholders of an embedded SQL text.
    pub fn render(&self, sql: &str) -> String {
        sql.replace("{{schema}}", &self.schema)
            .replace("{{prefix}}", &self.prefix)
    }

    /// `"schema"."prefix<name>"`, quoted.
    pub fn table(&self, name: &str) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table_name(name))
    }

    /// `"schema"."relation"`, quoted, for a relation named as the catalog names it (an
    /// application's index may hold any character).
    pub fn qualified(&self, relation: &str) -> String {
        format!("\"{}\".\"{}\"", self.schema, relation.replace('"', "\"\""))
    }

    /// `prefix<name>`, as the catalog names it.
    pub fn table_name(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }
}

/// A database name MongoDB accepts, checked before anything is sent.
fn check_database_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > 63 {
        return Err("it is longer than 63 bytes".into());
    }
    if let Some(c) = name.chars().find(|c| "/\\. \"$*<>:|?\0".contains(*c)) {
        return Err(format!("MongoDB database names cannot hold `{c}`"));
    }
    Ok(())
}

fn check(what: &str, value: &str, max: usize) -> Result<(), StoreError> {
    let invalid = |why: &str| StoreError::InvalidIdentifier {
        what: what.to_owned(),
        value: value.to_owned(),
        why: why.to_owned(),
        example: if what == "schema" {
            "public"
        } else {
            "relaybus_"
        },
    };
    // Without a prefix, relaybus's names are an application's (`events`), and setup would
    // take an application table for its own.
    if value.is_empty() {
        return Err(invalid("it is empty"));
    }
    if value.len() > max {
        return Err(invalid(&format!("it is longer than {max} bytes")));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(invalid(
            "only lower-case ASCII letters, digits and `_` are allowed",
        ));
    }
    if value.as_bytes()[0].is_ascii_digit() {
        return Err(invalid("it must not start with a digit"));
    }
    if what == "schema" && (value.starts_with("pg_") || value == "information_schema") {
        return Err(invalid("it is a schema of PostgreSQL's own"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_refuses_the_rest() {
        assert!(Namespace::new("public", "relaybus_").is_ok());
        assert!(Namespace::new("tenant_7", "rb_").is_ok());
        for (schema, prefix) in [
            ("Public", "relaybus_"),
            ("public", "a\"b"),
            ("7up", "x_"),
            ("", "x_"),
            ("pg_temp", "x_"),
            ("information_schema", "x_"),
            ("app", ""),
            ("public", "a;drop table x;"),
        ] {
            assert!(Namespace::new(schema, prefix).is_err(), "{schema} {prefix}");
        }
        let long = "p".repeat(33);
        let err = Namespace::new("public", &long).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "invalid prefix `{long}`: it is longer than 32 bytes; pass a name like `relaybus_`"
            )
        );
    }
}
