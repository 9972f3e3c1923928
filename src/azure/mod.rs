//! What hoist needs of Azure Service Bus' management REST API: SAS
//! signing, the Atom responses, and a small client. No crate offers the
//! runtime-count calls (`azure_messaging_servicebus` is a send/receive
//! client), so this is the least that works.

pub mod atom;
pub mod client;
pub mod sas;
