//! A YAML map read as a whole and then checked: the check runs inside the map's visitor,
//! where serde_yaml still knows the map's line and column, so a check that spans several
//! fields (a route's required ones, a store's URL and TLS settings) reports where the map
//! is.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// Deserializes a YAML map as `T`, then converts it with `convert` inside the map's
/// visitor, so that a conversion error carries the map's line and column.
pub(super) fn map_then<'de, D, T, U, F>(deserializer: D, convert: F) -> Result<U, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    F: FnOnce(T) -> Result<U, String>,
{
    struct MapThen<T, F> {
        convert: F,
        target: PhantomData<T>,
    }

    impl<'de, T, U, F> Visitor<'de> for MapThen<T, F>
    where
        T: Deserialize<'de>,
        F: FnOnce(T) -> Result<U, String>,
    {
        type Value = U;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<U, A::Error> {
            let value = T::deserialize(MapAccessDeserializer::new(map))?;
            (self.convert)(value).map_err(de::Error::custom)
        }
    }

    deserializer.deserialize_map(MapThen {
        convert,
        target: PhantomData,
    })
}
