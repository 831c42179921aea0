//! Kafka topics: creating a deployment's topic, and a fresh topic per test
//! or bench run, deleted when its handle is dropped.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use crate::database::unique_suffix;
use crate::error::{DevstackError, Result};

/// The broker list every test, bench and demo starts from: `KAFKA_BROKERS`,
/// else `127.0.0.1:9092`.
pub fn shared_brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn admin(brokers: &str) -> Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|source| DevstackError::Kafka {
            brokers: brokers.to_owned(),
            source,
        })
}

/// Creates `topic` with `partitions` partitions and one replica. A topic
/// that already exists is left as it is.
pub async fn create(brokers: &str, topic: &str, partitions: i32) -> Result<()> {
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin(brokers)?
        .create_topics(&[new], &options)
        .await
        .map_err(|source| DevstackError::Kafka {
            brokers: format!(
                "{brokers} (start the stack with scripts/stack.sh up, or set KAFKA_BROKERS)"
            ),
            source,
        })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(DevstackError::TopicRefused {
                    operation: "create",
                    topic,
                    code,
                })
            }
        }
    }
    Ok(())
}

/// Deletes `topic`; one that does not exist is not an error.
pub async fn delete(brokers: &str, topic: &str) -> Result<()> {
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin(brokers)?
        .delete_topics(&[topic], &options)
        .await
        .map_err(|source| DevstackError::Kafka {
            brokers: brokers.to_owned(),
            source,
        })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => {
                return Err(DevstackError::TopicRefused {
                    operation: "delete",
                    topic,
                    code,
                })
            }
        }
    }
    Ok(())
}

/// A topic of one run's own, `<prefix>.<random>`; deleted when dropped.
pub struct Topic {
    pub name: String,
    pub brokers: String,
}

impl Topic {
    /// Creates `<prefix>.<random>` with `partitions` partitions on `brokers`.
    pub async fn fresh(brokers: &str, prefix: &str, partitions: i32) -> Result<Self> {
        let name = format!("{prefix}.{}", unique_suffix());
        create(brokers, &name, partitions).await?;
        Ok(Self {
            name,
            brokers: brokers.to_owned(),
        })
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        let brokers = self.brokers.clone();
        let name = self.name.clone();
        let deleted = std::thread::spawn(move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(DevstackError::io("a runtime to delete a topic"))?;
            runtime.block_on(delete(&brokers, &name))
        })
        .join();
        if let Ok(Err(e)) = deleted {
            eprintln!("warning: could not delete topic {}: {e}", self.name);
        }
    }
}

/// How many partitions `topic` has, if the broker answers and knows it.
pub async fn partitions(brokers: &str, topic: &str) -> Option<i32> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let brokers = brokers.to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .ok()?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .ok()?;
        let found = metadata.topics().iter().find(|t| t.name() == topic)?;
        i32::try_from(found.partitions().len())
            .ok()
            .filter(|n| *n > 0)
    })
    .await
    .ok()
    .flatten()
}
