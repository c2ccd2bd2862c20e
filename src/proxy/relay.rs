//! A relay's place among the requests forwarded without a claim, kept past an abandoned
//! relay until its timeout.

use std::time::Duration;

use crate::server::RequestPermit;

/// A relay's place, kept until its timeout if the relay is dropped (its sender hung up)
/// before the upstream answered: the application may still be working on it, and the
/// proxy cannot know when it stops. Costs a task only when abandoned.
pub(super) struct RelayPlace {
    permit: Option<RequestPermit>,
    deadline: tokio::time::Instant,
}

impl RelayPlace {
    pub(super) fn keep(permit: RequestPermit, timeout: Duration) -> RelayPlace {
        RelayPlace {
            permit: Some(permit),
            deadline: tokio::time::Instant::now() + timeout,
        }
    }

    /// The upstream answered (or failed): the place goes with the response.
    pub(super) fn answered(mut self) {
        self.permit = None;
    }
}

impl Drop for RelayPlace {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let deadline = self.deadline;
            runtime.spawn(async move {
                tokio::time::sleep_until(deadline).await;
                drop(permit);
            });
        }
    }
}
