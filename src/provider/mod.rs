//! Providers: where databases really live (docs/providers.md).
//!
//! A provider observes databases and performs create/update/delete calls
//! that carry an [`OperationId`] as idempotency key. Observations are plain
//! data so the decision core can stay pure.

pub(crate) use crate::model::observation::OwnershipMarker;
pub use crate::model::observation::{
    Capabilities, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, Observed, ResourceStatus,
};
pub(crate) use crate::model::operation::OperationKind;
pub use crate::model::operation::{ChangeRequest, OperationId, ProviderError};
pub(crate) use crate::model::setting_list;

pub(crate) mod build;
pub(crate) use build::SetupError;
pub(crate) mod http;
pub(crate) mod postgres;
pub(crate) mod sandbox;
pub(crate) mod tls;

/// A place databases live.
///
/// # Guarantees expected of implementations
/// * `create`, `update` and `delete` are idempotent per [`OperationId`]: the
///   same id with the same request returns the original result; the same id
///   with a different request is a `Permanent` error.
/// * `observe_all` returns the databases named that exist (a cycle names
///   every resource it decides: a cycle over one name observes one
///   database, not every database carrying tend's marker).
///
/// Futures are `Send`, so the executor can run operations as tasks.
pub trait Provider: Send + Sync + 'static {
    fn capabilities(&self) -> Capabilities;
    /// `deep`: databases whose per-database fields (extensions) are wanted;
    /// a provider may leave those fields unobserved for the others.
    fn observe_all(
        &self,
        names: &[String],
        deep: &[String],
    ) -> impl Future<Output = Result<Vec<Observation>, ProviderError>> + Send;
    fn observe(
        &self,
        database_name: &str,
    ) -> impl Future<Output = Result<Option<Observation>, ProviderError>> + Send;
    fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> impl Future<Output = Result<Observation, ProviderError>> + Send;
    /// Sets the request's fields and labels (a label with an empty value is
    /// removed).
    fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> impl Future<Output = Result<Observation, ProviderError>> + Send;
    fn delete(
        &self,
        op: &OperationId,
        database_name: &str,
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;
}

/// Every provider kind this build runs, behind one type.
pub enum AnyProvider {
    Sandbox(Box<sandbox::SandboxProvider>),
    Postgres(Box<postgres::PostgresProvider>),
    Http(Box<http::HttpProvider>),
}

impl Provider for AnyProvider {
    fn capabilities(&self) -> Capabilities {
        match self {
            AnyProvider::Sandbox(p) => p.capabilities(),
            AnyProvider::Postgres(p) => p.capabilities(),
            AnyProvider::Http(p) => p.capabilities(),
        }
    }
    async fn observe_all(
        &self,
        names: &[String],
        deep: &[String],
    ) -> Result<Vec<Observation>, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.observe_all(names, deep).await,
            AnyProvider::Postgres(p) => p.observe_all(names, deep).await,
            AnyProvider::Http(p) => p.observe_all(names, deep).await,
        }
    }
    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.observe(database_name).await,
            AnyProvider::Postgres(p) => p.observe(database_name).await,
            AnyProvider::Http(p) => p.observe(database_name).await,
        }
    }
    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.create(op, request).await,
            AnyProvider::Postgres(p) => p.create(op, request).await,
            AnyProvider::Http(p) => p.create(op, request).await,
        }
    }
    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.update(op, request).await,
            AnyProvider::Postgres(p) => p.update(op, request).await,
            AnyProvider::Http(p) => p.update(op, request).await,
        }
    }
    async fn delete(&self, op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.delete(op, database_name).await,
            AnyProvider::Postgres(p) => p.delete(op, database_name).await,
            AnyProvider::Http(p) => p.delete(op, database_name).await,
        }
    }
}

impl AnyProvider {
    /// Every database the provider shows, for a provider whose observation
    /// is one listing whatever names it is asked for (the http provider):
    /// a cycle can then start it before it knows the declarations.
    /// `None`: this provider observes by name (the postgres provider reads
    /// each managed database's extensions), so there is nothing to start.
    pub async fn observe_everything(&self) -> Option<Result<Vec<Observation>, ProviderError>> {
        match self {
            AnyProvider::Http(p) => Some(p.observe_everything().await),
            AnyProvider::Sandbox(_) | AnyProvider::Postgres(_) => None,
        }
    }

    /// Every database the provider shows (`tend import`; a PostgreSQL
    /// server's templates aside), each observed in full but for the
    /// per-database fields (extensions) of those `deep` does not name.
    pub async fn observe_every_database(
        &self,
        deep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<Observation>, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.observe_every_database(),
            AnyProvider::Postgres(p) => p.observe_every_database(deep).await,
            AnyProvider::Http(p) => p.observe_everything().await,
        }
    }

    /// Whether [`AnyProvider::observe_everything`] has anything to do.
    pub fn lists_everything(&self) -> bool {
        matches!(self, AnyProvider::Http(_))
    }
}
