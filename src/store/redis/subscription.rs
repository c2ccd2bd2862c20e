//! The subscription to announced outcomes: each store hears, on `{prefix}outcomes`, the
//! keys that claims made with `announce` finished, released or held, on any replica.

use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;

use crate::store::Heard;

/// How often the subscription's connection is checked: one that died without a word
/// would otherwise leave waiters to their rechecks for good.
const SUBSCRIPTION_CHECK: Duration = Duration::from_secs(30);

/// Subscribes to `channel` and passes each store key published on it to `heard`, for
/// ever: when the subscription ends (the server went away), the next client in
/// `subscribers` subscribes again, after a pause that grows up to 5 s while none answers.
pub(super) async fn hear(
    subscribers: Vec<redis::Client>,
    channel: String,
    prefix: String,
    timeout: Duration,
    heard: Heard,
) {
    let mut pause = Duration::from_millis(100);
    for client in subscribers.iter().cycle() {
        let subscribing = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        };
        match tokio::time::timeout(timeout, subscribing).await {
            Ok(Ok(pubsub)) => {
                let (mut sink, mut messages) = pubsub.split();
                let mut checks = tokio::time::interval(SUBSCRIPTION_CHECK);
                checks.tick().await;
                loop {
                    tokio::select! {
                        message = messages.next() => {
                            let Some(message) = message else { break };
                            if let Some(key) = message.get_payload_bytes().strip_prefix(prefix.as_bytes())
                                && let Ok(key) = std::str::from_utf8(key)
                            {
                                heard(key);
                            }
                        }
                        _ = checks.tick() => {
                            let answer = tokio::time::timeout(timeout, sink.ping::<Value>()).await;
                            if !matches!(answer, Ok(Ok(_))) {
                                break;
                            }
                            // Held for a while: a server that drops it at once is not
                            // subscribed to again at once.
                            pause = Duration::from_millis(100);
                        }
                    }
                }
                tracing::warn!("the subscription to announced outcomes ended; subscribing again");
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot subscribe to announced outcomes; waiters look at the store again from time to time");
            }
            Err(_) => {
                tracing::warn!("subscribing to announced outcomes took longer than {timeout:?}")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}
