//! Service Bus management responses (Atom XML), read by namespace URI:
//! the prefixes (`d2p1`, `d3p1`, ...) vary between service versions.

/// Where the entity descriptions live.
const CONNECT: &str = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect";
/// Where `CountDetails`' children live.
const COUNTS: &str = "http://schemas.microsoft.com/netservices/2011/06/servicebus";
const ATOM: &str = "http://www.w3.org/2005/Atom";

/// One queue or subscription from a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    /// The entry's title: the queue or subscription name.
    pub name: String,
    pub active_message_count: i64,
}

/// Why a response body could not give a count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AtomError {
    #[error("the response is not XML: {0}")]
    NotXml(String),
    #[error("the response has no entity (an empty feed: the entity does not exist)")]
    Empty,
    #[error(
        "the response for `{0}` has no CountDetails: Service Bus leaves the counts out when it throttles; they return on a later poll"
    )]
    NoCountDetails(String),
    #[error("`{0}` has an ActiveMessageCount that is not a number")]
    BadCount(String),
}

/// A single entity (`GET /{queue}` or `/{topic}/Subscriptions/{name}`).
/// A missing queue answers 200 with an empty feed: that is [`AtomError::Empty`].
pub fn entity(body: &str) -> Result<Entity, AtomError> {
    let document =
        roxmltree::Document::parse(body).map_err(|e| AtomError::NotXml(e.to_string()))?;
    let root = document.root_element();
    if root.has_tag_name((ATOM, "entry")) {
        return read_entry(root);
    }
    if root.has_tag_name((ATOM, "feed")) {
        return match entries(root).next() {
            Some(entry) => read_entry(entry),
            None => Err(AtomError::Empty),
        };
    }
    Err(AtomError::NotXml(format!(
        "unexpected root element `{}`",
        root.tag_name().name()
    )))
}

/// Every entity of a list page (`$Resources/Queues`, `{topic}/Subscriptions`).
pub fn feed(body: &str) -> Result<Vec<Entity>, AtomError> {
    let document =
        roxmltree::Document::parse(body).map_err(|e| AtomError::NotXml(e.to_string()))?;
    let root = document.root_element();
    if !root.has_tag_name((ATOM, "feed")) {
        return Err(AtomError::NotXml(
            "a list response must be an Atom feed".into(),
        ));
    }
    entries(root).map(read_entry).collect()
}

/// The `Detail` of an `<Error>` body, if it has one.
pub fn error_detail(body: &str) -> Option<String> {
    let document = roxmltree::Document::parse(body).ok()?;
    document
        .descendants()
        .find(|node| node.has_tag_name("Detail"))
        .and_then(|node| node.text())
        .map(|text| text.trim().to_string())
}

fn entries<'a>(feed: roxmltree::Node<'a, 'a>) -> impl Iterator<Item = roxmltree::Node<'a, 'a>> {
    feed.children()
        .filter(|node| node.has_tag_name((ATOM, "entry")))
}

fn read_entry(entry: roxmltree::Node) -> Result<Entity, AtomError> {
    let name = entry
        .children()
        .find(|node| node.has_tag_name((ATOM, "title")))
        .and_then(|node| node.text())
        .unwrap_or_default()
        .trim()
        .to_string();
    let counts = entry
        .descendants()
        .find(|node| node.has_tag_name((CONNECT, "CountDetails")))
        .ok_or_else(|| AtomError::NoCountDetails(name.clone()))?;
    let active = counts
        .children()
        .find(|node| node.has_tag_name((COUNTS, "ActiveMessageCount")))
        .ok_or_else(|| AtomError::NoCountDetails(name.clone()))?;
    let active_message_count = active
        .text()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| AtomError::BadCount(name.clone()))?;
    Ok(Entity {
        name,
        active_message_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/data/servicebus/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn reads_counts_whatever_the_prefix() {
        let queue = entity(&fixture(
            "queue-runtime-properties.active1-dlq1-sched1.api2017-04.dotnet.xml",
        ))
        .unwrap();
        assert_eq!(queue.active_message_count, 1);
        let zero = entity(&fixture(
            "queue-runtime-properties.zero.api2021-05.java.xml",
        ))
        .unwrap();
        assert_eq!(
            (zero.name.as_str(), zero.active_message_count),
            ("queue-5", 0)
        );
        // d3p1 instead of d2p1.
        let subscription = entity(&fixture(
            "subscription-runtime-properties.active1-dlq1.api2017-04.dotnet.xml",
        ))
        .unwrap();
        assert_eq!(subscription.active_message_count, 1);
        let zero = entity(&fixture(
            "subscription-runtime-properties.zero.api2021-05.java.xml",
        ))
        .unwrap();
        assert_eq!(zero.active_message_count, 0);
    }

    #[test]
    fn lists_empty_feeds_and_errors() {
        let page = feed(&fixture(
            "subscriptions-list-feed.active1-dlq1.api2017-04.dotnet.xml",
        ))
        .unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].active_message_count, 1);
        assert_eq!(
            entity(&fixture(
                "queue-not-found.200-empty-feed.api2021-05.python.xml"
            )),
            Err(AtomError::Empty)
        );
        let detail = error_detail(&fixture("unauthorized.401.api2021-05.python.xml")).unwrap();
        assert!(
            detail.starts_with("claim is empty or token is invalid"),
            "{detail}"
        );
        let detail =
            error_detail(&fixture("subscription-not-found.404.api2021-05.java.xml")).unwrap();
        assert!(detail.contains("was not found"), "{detail}");
    }

    #[test]
    fn a_body_without_count_details_is_throttling_not_zero() {
        let body = fixture("queue-runtime-properties.zero.api2021-05.java.xml");
        let start = body.find("<CountDetails").unwrap();
        let end = body.find("</CountDetails>").unwrap() + "</CountDetails>".len();
        let stripped = format!("{}{}", &body[..start], &body[end..]);
        assert_eq!(
            entity(&stripped),
            Err(AtomError::NoCountDetails("queue-5".into()))
        );
    }
}
