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

        /// The value's name in words, for people (`InvalidStag`: "invalid STag").
        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self {
                    $( $name::$variant => crate::macros::words(stringify!($variant), f), )+
                }
            }
        }
    };
}

/// A CamelCase name as lower-case words, the protocols' acronyms in capitals:
/// `BaseOrBoundsViolation` "base or bounds violation", `InvalidStag` "invalid STag",
/// `ToWrap` "TO wrap" (the Tagged Offset).
pub(crate) fn words(ident: &str, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
    let mut start = 0;
    for (n, end) in ident
        .char_indices()
        .skip(1)
        .filter(|(_, c)| c.is_ascii_uppercase())
        .map(|(i, _)| i)
        .chain([ident.len()])
        .enumerate()
    {
        let w = &ident[start..end];
        start = end;
        if n > 0 {
            f.write_str(" ")?;
        }
        let acronym = match w {
            "Stag" => "STag",
            "Msn" => "MSN",
            "Mo" => "MO",
            "Qn" => "QN",
            "Ddp" => "DDP",
            "Rdmap" => "RDMAP",
            "Rdma" => "RDMA",
            "Crc" => "CRC",
            "Ird" => "IRD",
            "Ord" => "ORD",
            "Rtr" => "RTR",
            "Tcp" => "TCP",
            "Llp" => "LLP",
            "Psn" => "PSN",
            "Rd" => "RD",
            "Rpc" => "RPC",
            "Mpa" => "MPA",
            "Nfs" => "NFS",
            "To" if n == 0 => "TO",
            _ => "",
        };
        if acronym.is_empty() {
            for c in w.chars() {
                write!(f, "{}", c.to_ascii_lowercase())?;
            }
        } else {
            f.write_str(acronym)?;
        }
    }
    Ok(())
}
pub(crate) use wire_enum;
