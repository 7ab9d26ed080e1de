"""Images through ``pollama serve`` (old engine): a store model created with a projector layer
(the official ``ollama`` client uploads gemma-3-270m and a random gemma3 mmproj as ``files``),
``/api/show`` says ``vision``, and every API takes its own image shape and refuses bad ones with a
400 in its own error shape. Random weights: the answers are junk text, only their shape is checked."""

from __future__ import annotations

import base64
import io

import httpx
import ollama
import openai
import pytest
from PIL import Image as PILImage

from conftest import STORIES
from mmproj import write_mmproj
from serverproc import ServerProcess
from test_gemma3 import gemma3  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow
OPTS = {"temperature": 0, "num_predict": 4}


def png(seed: int = 0, size=(48, 32)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, (seed * 40 % 256, 90, 200)).save(buf, "PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def server(gemma3, tmp_path_factory):  # noqa: F811
    proj = write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf")
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CONTEXT_LENGTH": "512",
                          "OLLAMA_NEW_ENGINE": "0"}).start()
    client = ollama.Client(host=proc.url, timeout=120)
    files = {"gemma.gguf": client.create_blob(gemma3), "mmproj.gguf": client.create_blob(proj)}
    assert client.create(model="vis", files=files).status == "success"
    proc.client = client
    proc.projector_digest = files["mmproj.gguf"]
    yield proc
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def test_show_says_vision_and_names_the_projector(server):
    shown = server.client.show("vis")
    assert "vision" in shown.capabilities and "completion" in shown.capabilities
    assert server.projector_digest.replace(":", "-") in shown.modelfile
    raw = httpx.post(server.url + "/api/show", json={"model": "vis"}).json()
    assert raw["projector_info"]["general.architecture"] == "clip"
    assert raw["projector_info"]["clip.vision.projection_dim"] == 640
    assert "vision" not in server.client.show(str(STORIES)).capabilities


def test_ollama_chat_and_generate_take_images(server):
    image = png(1)
    first = server.client.chat(model="vis", options=OPTS, messages=[
        {"role": "user", "content": "What is this?", "images": [image]}])
    assert first.done and isinstance(first.message.content, str)
    assert first.prompt_eval_count > 16  # the image's 16 positions are part of the prompt
    second = server.client.chat(model="vis", options=OPTS, messages=[
        {"role": "user", "content": "What is this?", "images": [image]},
        {"role": "assistant", "content": first.message.content},
        {"role": "user", "content": "Sure?"}])
    assert second.done and second.prompt_eval_count > first.prompt_eval_count
    gen = server.client.generate(model="vis", prompt="Describe", images=[png(2)], options=OPTS)
    assert gen.done and gen.eval_count >= 1


def test_ollama_refusals(server):
    r = httpx.post(server.url + "/api/chat", json={"model": "vis", "messages": [
        {"role": "user", "content": "x", "images": ["%%% not base64"]}]})
    assert r.status_code == 400 and "not valid base64" in r.json()["error"]
    r = httpx.post(server.url + "/api/generate", json={"model": "vis", "prompt": "x",
                                                       "images": [b64(b"not an image")]})
    assert r.status_code == 400 and "not a PNG, JPEG or WEBP image" in r.json()["error"]
    r = httpx.post(server.url + "/api/chat", json={"model": str(STORIES), "messages": [
        {"role": "user", "content": "x", "images": [b64(png())]}]})
    assert r.status_code == 400
    assert r.json() == {"error": "this model is missing data required for image input"}


def test_openai_image_url_parts(server):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="pollama", max_retries=0, timeout=120)
    reply = oai.chat.completions.create(model="vis", max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(png(3))}}]}])
    assert reply.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="vis", max_tokens=4, messages=[
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    assert "remote image URLs are not supported" in err.value.body["message"]


def test_responses_input_image_parts(server):
    """``/v1/responses`` takes an ``input_image`` part as ``/v1/chat/completions`` takes an
    ``image_url`` one: the same prompt (every token of it cached from the chat's turn but the
    last) and, greedy from the same cache state, the same answer."""
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="pollama", max_retries=0, timeout=120)
    url = "data:image/png;base64," + b64(png(5))

    def chat():
        return oai.chat.completions.create(model="vis", max_tokens=4, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}])

    first = chat()
    reply = oai.responses.create(model="vis", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": url, "detail": "auto"}]}])
    assert reply.usage.input_tokens == first.usage.prompt_tokens > 16  # the image's 16 positions included
    assert reply.usage.input_tokens_details.cached_tokens == reply.usage.input_tokens - 1
    assert reply.output_text == chat().choices[0].message.content


def test_anthropic_image_blocks(server):
    def post(source):
        return httpx.post(server.url + "/v1/messages", timeout=120, json={
            "model": "vis", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": [
                {"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]}]})

    r = post({"type": "base64", "media_type": "image/png", "data": b64(png(4))})
    assert r.status_code == 200 and r.json()["type"] == "message"
    # count_tokens counts the image's positions as the request did
    used = r.json()["usage"]
    counted = httpx.post(server.url + "/v1/messages/count_tokens", timeout=120, json={
        "model": "vis", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png(4))}},
            {"type": "text", "text": "What is this?"}]}]})
    text_only = httpx.post(server.url + "/v1/messages/count_tokens", timeout=120, json={
        "model": "vis", "messages": [{"role": "user", "content": "What is this?"}]}).json()["input_tokens"]
    assert counted.status_code == 200
    assert counted.json()["input_tokens"] == used["input_tokens"] + used["cache_read_input_tokens"] > text_only
    r = post({"type": "base64", "media_type": "image/png", "data": "@@@"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "not valid base64" in r.json()["error"]["message"]
    r = post({"type": "url", "url": "https://example.com/cat.png"})
    assert r.status_code == 400 and "image URLs are not supported" in r.json()["error"]["message"]


def test_copy_keeps_the_projector_and_delete_collects_it_last(server):
    blob = server.models / "blobs" / server.projector_digest.replace(":", "-")
    server.client.create(model="vis-tmp", from_="vis")
    server.client.copy("vis-tmp", "vis-copy")
    assert "vision" in server.client.show("vis-copy").capabilities
    server.client.delete("vis-tmp")
    assert blob.is_file()  # still named by vis and vis-copy
    server.client.delete("vis-copy")
    assert blob.is_file()  # still named by vis


def test_delete_collects_a_projector_no_model_names(server, tmp_path):
    proj = write_mmproj(tmp_path / "other-mmproj.gguf", seed=5)
    digest = server.client.create_blob(proj)
    files = {"stories.gguf": server.client.create_blob(STORIES), "mmproj.gguf": digest}
    server.client.create(model="solo", files=files)
    blob = server.models / "blobs" / digest.replace(":", "-")
    assert blob.is_file() and "vision" in server.client.show("solo").capabilities
    server.client.delete("solo")
    assert not blob.is_file()
