//! Creating a usage topic (feature `kafka`): the benches and the tests make
//! their own topics; a deployment's topic is made by `scripts/stack.sh` or
//! by whoever runs the Kafka cluster.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// Why a topic could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot reach the broker at {brokers} (scripts/stack.sh up, or set KAFKA_BROKERS): {source}")]
    Unreachable {
        brokers: String,
        #[source]
        source: KafkaError,
    },
    #[error("the broker refused to create topic {topic}: {code}")]
    Refused {
        topic: String,
        code: RDKafkaErrorCode,
    },
}

/// Creates `topic` with `partitions` partitions and one replica. A topic
/// that already exists is left as it is.
pub async fn create(brokers: &str, topic: &str, partitions: i32) -> Result<(), TopicError> {
    let unreachable = |source| TopicError::Unreachable {
        brokers: brokers.to_owned(),
        source,
    };
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(unreachable)?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(&[new], &options)
        .await
        .map_err(unreachable)?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(TopicError::Refused { topic, code }),
        }
    }
    Ok(())
}
