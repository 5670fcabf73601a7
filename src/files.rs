//! Reading the files the configuration names (secrets, keys, certificates,
//! the configuration itself): regular files only. Writing tend's own files
//! (reports, the parse cache, the accepted commit): whole or not at all.
//!
//! # Guarantees
//! * A file tend writes goes through a new temporary file in the same
//!   directory, created exclusively (`O_EXCL`) under an unpredictable
//!   name: a symbolic link planted at a predictable name is never followed
//!   (the write would otherwise land in whatever file the link names).
//! * Nothing blocks on a file's kind: a FIFO is refused before it is
//!   opened (opening one waits for a writer, and a `tend run` start or
//!   reload would hang there), and the open is non-blocking in case the
//!   path was swapped in between. Devices (`/dev/zero` streams forever),
//!   directories and sockets are refused too.
//! * The refusal says what the path is, so the message names the mistake.

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes `bytes` to `path` whole or not at all (see [`write_atomically_with`]).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_with(path, |file| file.write_all(bytes))
}

/// Writes `path` through a new temporary file beside it (exclusive
/// create, unpredictable name, mode 0666 less the umask as `File::create`
/// gives), with what `write` writes to it buffered; the file is synced,
/// then renamed over `path`. Until the rename, `path` keeps its old
/// content; a failure removes the temporary file.
pub(crate) fn write_atomically_with<T>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<tempfile::NamedTempFile>) -> io::Result<T>,
) -> io::Result<T> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    let mut file = BufWriter::with_capacity(64 * 1024, tmp);
    let value = write(&mut file)?;
    let tmp = file.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(value)
}

/// Syncs `path` to disk: a file's content, or a directory's entries (a
/// rename or a removal in it).
pub(crate) fn sync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Opens `path` for reading if it is a regular file (symbolic links are
/// followed: systemd's credentials may be links).
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    regular(&std::fs::metadata(path)?)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    regular(&file.metadata()?)?;
    Ok(file)
}

/// At most `limit + 1` bytes of the regular file `path` (one more than the
/// limit tells a caller the file is too large).
pub(crate) fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The regular file `path` as UTF-8 text, at most `limit` bytes.
pub(crate) fn read_regular_to_string(path: &Path, limit: u64) -> io::Result<String> {
    let bytes = read_regular(path, limit)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("it is larger than {limit} bytes"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

fn regular(meta: &Metadata) -> io::Result<()> {
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe): reading it would wait for a writer"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "something else"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {what}, not a regular file"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened_and_a_fifo_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = open_regular(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(read_regular_to_string(&file, 100).unwrap(), "s3cret\n");
        assert!(read_regular_to_string(&file, 3).is_err());
    }
}
