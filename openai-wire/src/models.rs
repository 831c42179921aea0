//! `GET /v1/models`: the models a server serves, as OpenAI lists them
//! (`{"object": "list", "data": [{"id", "object": "model", "created",
//! "owned_by"}]}`) plus vLLM's `max_model_len`. A server builds its list
//! once, when it starts (its models do not change while it runs), and
//! answers every request with it.

use serde::{Deserialize, Serialize};

/// The list `GET /v1/models` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: String,
    pub data: Vec<Model>,
}

/// One model of the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    /// The name clients send as `model`.
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds; 0 (a model here has no creation date of its own).
    pub created: i64,
    pub owned_by: String,
    /// The longest prompt plus output it accepts, in tokens (vLLM's field).
    pub max_model_len: u32,
}

impl ModelList {
    /// The list of `models`, each a name and its context length, in order.
    pub fn new<'a>(models: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        Self {
            object: "list".to_owned(),
            data: models
                .into_iter()
                .map(|(id, max_model_len)| Model {
                    id: id.to_owned(),
                    object: "model".to_owned(),
                    created: 0,
                    owned_by: "meterline".to_owned(),
                    max_model_len,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn the_list_is_openais_shape_with_max_model_len() {
        let list = ModelList::new([("llama-3.1-8b", 131_072)]);
        assert_eq!(
            serde_json::to_value(&list).unwrap(),
            serde_json::json!({"object": "list", "data": [{
                "id": "llama-3.1-8b", "object": "model", "created": 0,
                "owned_by": "meterline", "max_model_len": 131_072
            }]})
        );
    }
}
