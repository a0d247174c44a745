"""A batch through the batch service with the openai SDK, exactly as against OpenAI.

OPENAI_BASE_URL=http://127.0.0.1:8484/v1 OPENAI_API_KEY=sk-batch-... python examples/batch_service/client.py
"""

import json
import tempfile
import time
from pathlib import Path

from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment

requests = [
    {
        "custom_id": f"q{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "stub-model", "messages": [{"role": "user", "content": f"Question {i}?"}], "max_tokens": 16},
    }
    for i in range(10)
]
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    batch_file = client.files.create(file=path.open("rb"), purpose="batch")

batch = client.batches.create(
    input_file_id=batch_file.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"project": "demo"},
)
while batch.status not in ("completed", "failed", "cancelled", "expired"):
    time.sleep(1)
    batch = client.batches.retrieve(batch.id)

print(batch.status, batch.request_counts)
if batch.output_file_id:
    for line in client.files.content(batch.output_file_id).text.splitlines():
        answer = json.loads(line)
        print(answer["custom_id"], answer["response"]["body"]["choices"][0]["message"]["content"])
if batch.error_file_id:
    print(client.files.content(batch.error_file_id).text)
