//! State columns (`recovery_point`, `payments.status`) are `text` with a `CHECK` listing their values;
//! in Rust they are enums. This macro writes the mapping between the two once.

/// Declares an enum stored in a `text` column, with its `ToSql`/`FromSql`, `as_str` and `Serialize`.
///
/// Each variant names the exact string the migration's `CHECK` constraint allows.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, diesel::expression::AsExpression, diesel::deserialize::FromSqlRow)]
        #[diesel(sql_type = diesel::sql_types::Text)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant, )+
        }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: &[Self] = &[$( Self::$variant, )+];

            /// The value as stored in the database and shown in the API.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $text, )+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn to_sql<'b>(
                &'b self,
                out: &mut diesel::serialize::Output<'b, '_, diesel::pg::Pg>,
            ) -> diesel::serialize::Result {
                use std::io::Write as _;
                out.write_all(self.as_str().as_bytes())?;
                Ok(diesel::serialize::IsNull::No)
            }
        }

        impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn from_sql(value: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
                match value.as_bytes() {
                    $( bytes if bytes == $text.as_bytes() => Ok(Self::$variant), )+
                    other => Err(format!(
                        "unexpected {} {:?}",
                        stringify!($name),
                        String::from_utf8_lossy(other)
                    )
                    .into()),
                }
            }
        }
    };
}

pub(crate) use text_enum;
