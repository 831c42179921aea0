//! The OpenAI chat-completions wire format, defined once, on the ground
//! floor (as `usage-contract` is for the topic): what the engine's own HTTP
//! server and the gateway read and write, and what the HTTP upstream client
//! reads back from vLLM or the engine. It imports nothing of the simulator;
//! the engine turns a simulated completion into these types itself.
//!
//! Layout:
//! - [`request`]: the request as it arrives (`POST /v1/chat/completions`)
//! - [`response`]: `chat.completion`, `chat.completion.chunk` (the final
//!   usage chunk of `stream_options.include_usage` included), `usage`, and
//!   Meterline's `meterline` extension with the engine's exact GPU figures
//! - [`error`]: the error body `{"error": {"message", "type", "param", "code"}}`
//! - [`models`]: the list `GET /v1/models` answers, built once per server
//!
//! Both servers also refuse a NUL character (U+0000) in what they read of
//! the request — the model, a message's content — with a 400 naming it
//! ([`ChatRequest::nul_field`]); `serving::nul::reject_in_query` refuses one
//! in the query.

pub mod error;
pub mod models;
pub mod request;
pub mod response;

pub use error::{ApiError, ErrorBody, ErrorKind, GENERIC_SERVER_ERROR};
pub use models::{Model, ModelList};
pub use request::{
    ChatRequest, Content, ContentPart, FunctionCall, FunctionDefinition, ImageUrl, InputAudio,
    Invalid, Message, NamedToolChoice, NulField, ResponseFormat, Role, Stop, StreamOptions, Tool,
    ToolCall, ToolChoice, ToolChoiceMode, AUDIO_PART_TOKENS, IMAGE_PART_TOKENS,
};
pub use response::{
    AssistantMessage, ChatCompletion, ChatCompletionChunk, Choice, ChunkChoice, ChunkStream, Delta,
    FinishReason, Meterline, PromptTokensDetails, Usage,
};
