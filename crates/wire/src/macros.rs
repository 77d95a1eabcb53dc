//! Crate-internal macros shared by the codecs.

/// Defines a C-like wire enum with `TryFrom<repr>` (undefined values give
/// `Error::Unknown`), `From<enum> for repr` and an `ALL` table.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident : $repr:ty => ($layer:expr, $field:expr) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[repr($repr)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every defined value, in numeric order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
        }

        impl TryFrom<$repr> for $name {
            type Error = crate::Error;
            fn try_from(value: $repr) -> crate::Result<Self> {
                match value {
                    $( v if v == $value => Ok($name::$variant), )+
                    _ => Err(crate::Error::Unknown {
                        layer: $layer,
                        field: $field,
                        value: u64::from(value),
                    }),
                }
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value as $repr
            }
        }
    };
}
pub(crate) use wire_enum;
