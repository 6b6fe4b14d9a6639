//! An object in the store's bucket (an archive object, an offloaded payload): put, and fetched back whole or in part.

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;

use crate::error::{Error, Result};

/// Where the archive's objects are.
#[derive(Debug, Clone)]
pub struct Bucket {
    pub s3: aws_sdk_s3::Client,
    pub name: String,
}

impl Bucket {
    /// The bucket `name`, reached the SDK's standard way (`AWS_ENDPOINT_URL`
    /// locally: S3's endpoint rules address an IP endpoint by path).
    pub fn new(aws: &aws_config::SdkConfig, name: String) -> Self {
        Self { s3: aws_sdk_s3::Client::new(aws), name }
    }

    /// Puts `object` only if there is no object at `key` (`If-None-Match: *`):
    /// true when it was written, false when one was already there.
    pub(crate) async fn put_new(&self, key: &str, object: Vec<u8>, content_type: &str) -> Result<bool> {
        let put = self
            .s3
            .put_object()
            .bucket(&self.name)
            .key(key)
            .content_type(content_type)
            .if_none_match("*")
            .body(ByteStream::from(object))
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(e)
                if e.code() == Some("PreconditionFailed")
                    || e.raw_response().is_some_and(|r| r.status().as_u16() == 412) =>
            {
                Ok(false)
            }
            Err(e) => Err(Error::s3("PutObject", e)),
        }
    }

    /// The object's bytes.
    pub async fn get(&self, key: &str) -> Result<Bytes> {
        self.get_if_there(key).await?.ok_or_else(|| Error::Archive(format!("s3://{}/{key} is missing", self.name)))
    }

    /// Bytes `range` of the object (a ranged `GET`): exactly those, or an error.
    pub(crate) async fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let got = self
            .s3
            .get_object()
            .bucket(&self.name)
            .key(key)
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await
            .map_err(|e| Error::s3("GetObject", e))?;
        let body =
            got.body.collect().await.map_err(|e| Error::Archive(format!("reading s3://{}/{key}: {e}", self.name)))?;
        let body = body.into_bytes();
        if body.len() as u64 != range.end - range.start {
            return Err(Error::Archive(format!(
                "s3://{}/{key}: asked for bytes {range:?}, got {} bytes",
                self.name,
                body.len()
            )));
        }
        Ok(body)
    }

    /// The object's bytes, or `None` when there is no such object.
    pub(crate) async fn get_if_there(&self, key: &str) -> Result<Option<Bytes>> {
        let got = match self.s3.get_object().bucket(&self.name).key(key).send().await {
            Ok(got) => got,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(Error::s3("GetObject", e)),
        };
        let body =
            got.body.collect().await.map_err(|e| Error::Archive(format!("reading s3://{}/{key}: {e}", self.name)))?;
        Ok(Some(body.into_bytes()))
    }
}
