//! Any consumer group's committed offsets, read through a client that is
//! not in that group: librdkafka's Admin API `ListConsumerGroupOffsets`
//! (an OffsetFetch naming the group, sent to its coordinator), so that one
//! client per broker set serves every group on it.
//!
//! Hand-written because nothing offers it: the `rdkafka` crate (0.39)
//! wraps librdkafka's consumer `committed()`, which asks for the client's
//! own `group.id` only, and its `AdminClient` has no
//! `list_consumer_group_offsets`; librdkafka has had the call since 2.0
//! (this build: 2.12.1 through `rdkafka-sys`). The FFI is in this module
//! alone, behind `committed`; every librdkafka object it makes is owned by
//! an [`Owned`] and freed when that is dropped, on every path.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr::NonNull;
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::types::RDKafkaErrorCode;

/// What reading a group's offsets can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GroupOffsetsError {
    /// The broker or librdkafka answered with an error (the group's
    /// coordinator unknown or loading, authorization, a timeout).
    #[error("{message}")]
    Kafka { code: RDKafkaErrorCode, message: String },
    /// No answer came, not even librdkafka's own timeout.
    #[error("no answer to ListConsumerGroupOffsets within {0:?}")]
    NoAnswer(Duration),
    /// What cannot be asked: a group name with a NUL byte, no partition.
    #[error("{0}")]
    Invalid(&'static str),
    /// librdkafka answered something other than one group's offsets.
    #[error("unexpected answer to ListConsumerGroupOffsets: {0}")]
    Unexpected(&'static str),
}

impl GroupOffsetsError {
    /// Kafka's (or librdkafka's) code, when there is one.
    pub fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            Self::Kafka { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// A partition's committed offset: `None` when the group has none there.
pub type Committed = HashMap<(String, i32), Option<i64>>;

/// The committed offsets of `group` for each of `partitions` (every
/// partition asked is in the answer), in one OffsetFetch, through
/// `client` whatever its own `group.id`. Blocks up to about `timeout`.
///
/// As librdkafka's consumer `committed()` (with `isolation.level`
/// `read_uncommitted`): offsets are not required to be stable, and a
/// partition the broker answers with an error of its own (an unknown
/// partition) counts as not committed; only the group's or the request's
/// error fails the read.
pub fn committed<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    partitions: &TopicPartitionList,
    timeout: Duration,
) -> Result<Committed, GroupOffsetsError> {
    if partitions.count() == 0 {
        // librdkafka would refuse it (NULL there means every partition).
        return Err(GroupOffsetsError::Invalid("no partition to ask the committed offsets of"));
    }
    let group = CString::new(group).map_err(|_| GroupOffsetsError::Invalid("the group name holds a NUL byte"))?;
    let answered = fetch(client.native_ptr(), &group, partitions, timeout)?;
    let mut committed: Committed = partitions
        .elements()
        .iter()
        .map(|asked| ((asked.topic().to_string(), asked.partition()), None))
        .collect();
    for (topic, partition, offset) in answered {
        // Kafka's -1 (librdkafka's INVALID, -1001, once parsed): none.
        committed.insert((topic, partition), (offset >= 0).then_some(offset));
    }
    Ok(committed)
}

/// A librdkafka object this module made, freed with `free` when dropped.
struct Owned<T> {
    ptr: NonNull<T>,
    free: unsafe extern "C" fn(*mut T),
}

impl<T> Owned<T> {
    /// `None` when librdkafka made nothing (a null pointer).
    fn new(ptr: *mut T, free: unsafe extern "C" fn(*mut T)) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self { ptr, free })
    }

    fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from the librdkafka constructor whose
        // destructor `free` is, and nothing else frees it.
        unsafe { (self.free)(self.ptr.as_ptr()) }
    }
}

/// The request, on a queue of its own, and its answer: (topic, partition,
/// offset) as librdkafka parsed them.
fn fetch(
    rk: *mut rd::rd_kafka_t,
    group: &CStr,
    partitions: &TopicPartitionList,
    timeout: Duration,
) -> Result<Vec<(String, i32, i64)>, GroupOffsetsError> {
    use GroupOffsetsError::Unexpected;
    let timeout_ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // librdkafka's own timeout (request_timeout below) ends the request and
    // answers __TIMED_OUT; the queue is waited on a second longer so that
    // answer, naming what timed out, is the one normally seen.
    let wait_ms = timeout_ms.saturating_add(1000);
    // SAFETY: `rk` is a live client (its owner borrows it for this call);
    // `group` and `partitions` outlive the calls that read them, and
    // librdkafka copies both into its request. Every object made here is
    // an `Owned`, freed on return. Pointers read from the answer (the
    // group's result, its error, its partitions, their topic names) belong
    // to `event` and are only read, copied out, before it is dropped.
    unsafe {
        let request = Owned::new(
            rd::rd_kafka_ListConsumerGroupOffsets_new(group.as_ptr(), partitions.ptr()),
            rd::rd_kafka_ListConsumerGroupOffsets_destroy,
        )
        .ok_or(Unexpected("no request made"))?;
        let options = Owned::new(
            rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS),
            rd::rd_kafka_AdminOptions_destroy,
        )
        .ok_or(Unexpected("no admin options made"))?;
        let mut reason = [0 as c_char; 256];
        let set = rd::rd_kafka_AdminOptions_set_request_timeout(options.as_ptr(), timeout_ms, reason.as_mut_ptr(), reason.len());
        if set != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(GroupOffsetsError::Kafka {
                code: set.into(),
                message: CStr::from_ptr(reason.as_ptr()).to_string_lossy().into_owned(),
            });
        }
        let queue = Owned::new(rd::rd_kafka_queue_new(rk), rd::rd_kafka_queue_destroy).ok_or(Unexpected("no queue made"))?;
        let mut requests = [request.as_ptr()];
        rd::rd_kafka_ListConsumerGroupOffsets(rk, requests.as_mut_ptr(), requests.len(), options.as_ptr(), queue.as_ptr());
        // A request still running when this gives up answers into the queue
        // after we dropped it; librdkafka counts references to it.
        let event = Owned::new(rd::rd_kafka_queue_poll(queue.as_ptr(), wait_ms), rd::rd_kafka_event_destroy)
            .ok_or(GroupOffsetsError::NoAnswer(timeout))?;
        if rd::rd_kafka_event_type(event.as_ptr()) != rd::RD_KAFKA_EVENT_LISTCONSUMERGROUPOFFSETS_RESULT {
            return Err(Unexpected("another kind of event"));
        }
        let code = rd::rd_kafka_event_error(event.as_ptr());
        if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(GroupOffsetsError::Kafka {
                code: code.into(),
                message: text(rd::rd_kafka_event_error_string(event.as_ptr())),
            });
        }
        let result = rd::rd_kafka_event_ListConsumerGroupOffsets_result(event.as_ptr());
        if result.is_null() {
            return Err(Unexpected("no result in the event"));
        }
        let mut count = 0;
        let groups = rd::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut count);
        if groups.is_null() || count != 1 {
            return Err(Unexpected("not one group in the result"));
        }
        let group_result = *groups;
        let error = rd::rd_kafka_group_result_error(group_result);
        if !error.is_null() {
            return Err(GroupOffsetsError::Kafka {
                code: rd::rd_kafka_error_code(error).into(),
                message: text(rd::rd_kafka_error_string(error)),
            });
        }
        let list = rd::rd_kafka_group_result_partitions(group_result);
        if list.is_null() || (*list).cnt <= 0 || (*list).elems.is_null() {
            return Ok(Vec::new());
        }
        let elements = std::slice::from_raw_parts((*list).elems, (*list).cnt as usize);
        Ok(elements
            .iter()
            .filter(|element| !element.topic.is_null())
            .map(|element| (text(element.topic), element.partition, element.offset))
            .collect())
    }
}

/// A C string librdkafka owns, copied (empty when null).
///
/// # Safety
/// `text` is null or a NUL-terminated string alive for this call.
unsafe fn text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    fn unreachable_client() -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("log_level", "0")
            .create()
            .unwrap()
    }

    fn one_partition() -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        list.add_partition("t", 0);
        list
    }

    /// What librdkafka would refuse or cannot send is refused before any
    /// object is made.
    #[test]
    fn no_partition_or_a_nul_in_the_group_is_refused() {
        let client = unreachable_client();
        let none = committed(client.client(), "g", &TopicPartitionList::new(), Duration::from_secs(1));
        assert!(matches!(none, Err(GroupOffsetsError::Invalid(_))), "{none:?}");
        let nul = committed(client.client(), "g\0h", &one_partition(), Duration::from_secs(1));
        assert!(matches!(nul, Err(GroupOffsetsError::Invalid(_))), "{nul:?}");
    }

    /// No coordinator to ask: librdkafka's own timeout answers, with its
    /// code (not our wait running out first); asked again, the same
    /// (nothing left over from the first request).
    #[test]
    fn an_unreachable_cluster_times_out_with_librdkafkas_answer() {
        let client = unreachable_client();
        for _ in 0..2 {
            let answer = committed(client.client(), "g", &one_partition(), Duration::from_millis(300));
            match answer {
                Err(error @ GroupOffsetsError::Kafka { .. }) => {
                    assert_eq!(error.code(), Some(RDKafkaErrorCode::OperationTimedOut), "{error}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
