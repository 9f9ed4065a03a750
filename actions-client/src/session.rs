//! A message session owned by one listener: long poll, acknowledge, acquire, with the message-queue token
//! refreshed transparently (docs/reference/actions-service-protocol.md, "Message sessions").

use tokio::sync::Mutex;

use crate::client::ActionsClient;
use crate::error::{ErrorKind, Result};
use crate::messages::RunnerScaleSetMessage;
use crate::models::{RunnerScaleSetSession, Statistics};
use crate::secret::SecretString;

/// Owns a message session. On a 401 from the queue or acquire-jobs it refreshes the session once and repeats the
/// call once; a second 401 is returned as [`ErrorKind::MessageQueueTokenExpired`].
///
/// Calls may run concurrently: when several see the same stale token, only the first refreshes.
/// The session is not deleted on drop (that needs an async call); call [`MessageSessionClient::close`].
#[derive(Debug)]
pub struct MessageSessionClient {
    client: ActionsClient,
    scale_set_id: i64,
    session: Mutex<RunnerScaleSetSession>,
}

#[derive(Clone)]
struct QueueAccess {
    url: String,
    token: SecretString,
}

impl MessageSessionClient {
    /// Wraps a session created with [`ActionsClient::create_message_session`].
    pub fn new(client: ActionsClient, scale_set_id: i64, session: RunnerScaleSetSession) -> Self {
        Self {
            client,
            scale_set_id,
            session: Mutex::new(session),
        }
    }

    /// The scale set this session belongs to.
    pub fn scale_set_id(&self) -> i64 {
        self.scale_set_id
    }

    /// A copy of the current session (it changes on refresh).
    pub async fn session(&self) -> RunnerScaleSetSession {
        self.session.lock().await.clone()
    }

    /// The statistics from session creation or the last refresh.
    pub async fn statistics(&self) -> Option<Statistics> {
        self.session.lock().await.statistics
    }

    async fn access(&self) -> QueueAccess {
        let session = self.session.lock().await;
        QueueAccess {
            url: session.message_queue_url.clone(),
            token: session.message_queue_access_token.clone(),
        }
    }

    /// Refreshes the session and stores the result.
    pub async fn refresh(&self) -> Result<()> {
        let mut session = self.session.lock().await;
        let refreshed = self
            .client
            .refresh_message_session(self.scale_set_id, session.session_id)
            .await?;
        *session = refreshed;
        Ok(())
    }

    /// Refreshes unless another call already replaced `stale` while this one waited.
    async fn refresh_replacing(&self, stale: &SecretString) -> Result<()> {
        let mut session = self.session.lock().await;
        if session.message_queue_access_token != *stale {
            return Ok(());
        }
        tracing::debug!(
            scale_set_id = self.scale_set_id,
            "message queue token expired; refreshing the session"
        );
        let refreshed = self
            .client
            .refresh_message_session(self.scale_set_id, session.session_id)
            .await?;
        *session = refreshed;
        Ok(())
    }

    async fn with_refresh<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(QueueAccess) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let access = self.access().await;
        match call(access.clone()).await {
            Err(err) if err.is(ErrorKind::MessageQueueTokenExpired) => {
                self.refresh_replacing(&access.token).await?;
                call(self.access().await).await
            }
            other => other,
        }
    }

    /// Long-polls for the next message after `last_message_id` (0 for "from the start"), reporting
    /// `max_capacity` (the scale set's maximum runners). `None` means the poll window passed without a message.
    pub async fn get_message(
        &self,
        last_message_id: i64,
        max_capacity: u32,
    ) -> Result<Option<RunnerScaleSetMessage>> {
        self.with_refresh(|access| async move {
            self.client
                .get_message(&access.url, &access.token, last_message_id, max_capacity)
                .await
        })
        .await
    }

    /// Acknowledges a message so it is not delivered again.
    pub async fn delete_message(&self, message_id: i64) -> Result<()> {
        self.with_refresh(|access| async move {
            self.client
                .delete_message(&access.url, &access.token, message_id)
                .await
        })
        .await
    }

    /// Acquires `JobAvailable` jobs by their `runnerRequestId`; returns the ids acquired.
    pub async fn acquire_jobs(&self, request_ids: &[i64]) -> Result<Vec<i64>> {
        self.with_refresh(|access| async move {
            self.client
                .acquire_jobs(self.scale_set_id, &access.token, request_ids)
                .await
        })
        .await
    }

    /// Deletes the session. Call on shutdown, outside any cancelled context.
    pub async fn close(&self) -> Result<()> {
        let session_id = self.session.lock().await.session_id;
        self.client
            .delete_message_session(self.scale_set_id, session_id)
            .await
    }
}
