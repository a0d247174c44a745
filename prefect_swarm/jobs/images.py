"""Images in chat rows: OpenAI multimodal content parts, checked before anything is sent.

A message's ``content`` may be a list of parts, ``{"type": "text", "text": ...}`` and
``{"type": "image_url", "image_url": {"url": ...}}`` where the URL is http(s) or a data URL
``data:image/<type>;base64,<data>``. A binary image column becomes such a data URL, its mime type
given or read from the image's first bytes (PNG, JPEG, GIF, WebP, BMP, TIFF). Anything else (a file
path, another scheme, a data URL that is not an image or not base64, bytes of an unknown format)
raises :class:`~prefect_swarm.jobs.api.RowRefused`: the row is an error row and no request is sent.
So does a row past the bounds one row may ask for: :data:`MAX_IMAGE_BYTES` per image and
:data:`MAX_IMAGES_PER_ROW` images in a row's messages.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

from prefect_swarm.exceptions import RowRefused

MAX_IMAGE_BYTES = 20 * 2**20
"""The largest image one row may send, in bytes (OpenAI's limit per image: 20 MB). A data URL counts
its decoded bytes."""
MAX_IMAGES_PER_ROW = 16
"""The most images one row's messages may hold: each is encoded by the engine's vision tower before
the row's first token, so one row of hundreds would hold a replica's batch."""

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


def sniff_mime(data: bytes) -> str | None:
    """The image mime type from the first bytes, or None when they are no known image format."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _MAGIC if data.startswith(magic)), None)


def image_part(value: Any, mime: str | None = None) -> dict[str, Any]:
    """An ``image_url`` part from image bytes (made a data URL), an http(s) URL or a data URL."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if not data:
            raise RowRefused("the image is empty (0 bytes)")
        _check_size(len(data))
        kind = mime or sniff_mime(data)
        if kind is None:
            raise RowRefused(
                f"the image bytes are no known format (first bytes {data[:8].hex()}); give image_mime, "
                "or store PNG, JPEG, GIF, WebP, BMP or TIFF"
            )
        return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{base64.b64encode(data).decode()}"}}
    if isinstance(value, str):
        check_image_url(value)
        return {"type": "image_url", "image_url": {"url": value}}
    raise RowRefused(f"an image must be bytes or a URL string, not {type(value).__name__}")


def check_image_url(url: str) -> None:
    """Refuse an image URL that is neither http(s) with a host nor a base64 image data URL."""
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
            raise RowRefused(f"image data URL must be 'data:image/<type>;base64,<data>', got {url[:40]!r}")
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RowRefused(f"image data URL does not hold valid base64 ({exc})") from None
        _check_size(len(decoded))
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RowRefused(
            f"image URL {url[:80]!r} is neither http(s) nor a data URL; the engine cannot fetch it. "
            "Put the image bytes in a binary column (image_column), or give an http(s) URL."
        )


def _check_size(size: int) -> None:
    if size > MAX_IMAGE_BYTES:
        raise RowRefused(
            f"the image is {size:,} bytes, more than the {MAX_IMAGE_BYTES:,} one row may send; scale it down first"
        )


def check_image_count(count: int) -> None:
    """Refuse a row whose messages hold more than :data:`MAX_IMAGES_PER_ROW` images."""
    if count > MAX_IMAGES_PER_ROW:
        raise RowRefused(
            f"the row holds {count} images, more than the {MAX_IMAGES_PER_ROW} one row may send; split it into rows"
        )


def check_messages(messages: Any) -> int:
    """Refuse messages whose content parts are not OpenAI's shape (text parts, image_url parts), or
    that hold more images than one row may send; the number of images they hold."""
    if not isinstance(messages, list):
        raise RowRefused(f"messages must be a list of {{role, content}}, not {type(messages).__name__}")
    images = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                _check_part(part, f"messages[{i}].content[{j}]")
                images += part.get("type") == "image_url"
    check_image_count(images)
    return images


def _check_part(part: Any, where: str) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise RowRefused(f"{where}: a text part needs a string 'text'")
    elif kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise RowRefused(f"{where}: an image_url part needs image_url: {{url: ...}}")
        try:
            check_image_url(url)
        except RowRefused as exc:
            raise RowRefused(f"{where}: {exc}") from None
    else:
        raise RowRefused(f"{where}: a content part's type must be 'text' or 'image_url', got {kind!r}")
