"""llama.cpp's built-in chat templates (``src/llama-chat.cpp``: ``llm_chat_apply_template``),
for GGUFs that carry no ``tokenizer.chat_template``.

Each built-in is a small function of the messages; :func:`apply` renders one by its llama.cpp
name (``"gemma"``, ``"chatml"``, ``"llama3"``…) and equals ``llama_chat_apply_template`` with
that name byte for byte (the tests compare them). ``trim`` is llama.cpp's: C's ``isspace``
characters at both ends.

Which one a model gets is :data:`BY_ARCHITECTURE`: only architectures whose chat models all
speak one format. ``llama`` is not there (Llama 2, Llama 3, Mistral, SmolLM and many base
models share it), so a llama GGUF without a template stays plain text.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..api import Message

__all__ = ["BY_ARCHITECTURE", "NAMES", "apply", "for_architecture"]

_SPACE = " \t\n\v\f\r"


def _trim(text: str) -> str:
    return text.strip(_SPACE)


Builtin = Callable[[Sequence[Message], bool], str]


def _chatml(chat: Sequence[Message], add_ass: bool) -> str:
    out = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in chat]
    return "".join(out) + ("<|im_start|>assistant\n" if add_ass else "")


def _mistral_v7(tekken: bool) -> Builtin:
    space = "" if tekken else " "

    def render(chat: Sequence[Message], add_ass: bool) -> str:
        out = []
        for m in chat:
            if m.role == "system":
                out.append(f"[SYSTEM_PROMPT]{space}{m.content}[/SYSTEM_PROMPT]")
            elif m.role == "user":
                out.append(f"[INST]{space}{m.content}[/INST]")
            else:
                out.append(f"{space}{m.content}</s>")
        return "".join(out)

    return render


def _mistral(version: str) -> Builtin:
    leading = " " if version == "v1" else ""
    trailing = "" if version == "v3-tekken" else " "
    trim_answer = version == "v3"

    def render(chat: Sequence[Message], add_ass: bool) -> str:
        out, inside = [], False
        for m in chat:
            if not inside:
                out.append(f"{leading}[INST]{trailing}")
                inside = True
            if m.role == "system":
                out.append(m.content + "\n\n")
            elif m.role == "user":
                out.append(f"{m.content}{leading}[/INST]")
            else:
                out.append(f"{trailing}{_trim(m.content) if trim_answer else m.content}</s>")
                inside = False
        return "".join(out)

    return render


def _llama2(system: bool, bos_inside: bool, strip: bool) -> Builtin:
    def render(chat: Sequence[Message], add_ass: bool) -> str:
        out, inside = ["[INST] "], True
        for m in chat:
            content = _trim(m.content) if strip else m.content
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if m.role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n")
            elif m.role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)

    return render


def _role_lines(open_: str, close: str, end: str, gen: str, trim: bool = False) -> Builtin:
    """Templates of the form ``open role close content end`` per message, then ``gen``."""

    def render(chat: Sequence[Message], add_ass: bool) -> str:
        out = [f"{open_}{m.role}{close}{_trim(m.content) if trim else m.content}{end}" for m in chat]
        return "".join(out) + (gen if add_ass else "")

    return render


def _gemma(chat: Sequence[Message], add_ass: bool) -> str:
    out, system = [], ""
    for m in chat:
        if m.role == "system":
            system += _trim(m.content)  # gemma has no system turn: it joins the next user turn
            continue
        role = "model" if m.role == "assistant" else m.role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m.content) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_ass else "")


def _monarch(chat: Sequence[Message], add_ass: bool) -> str:
    out = [("" if i == 0 else "<s>") + f"{m.role}\n{m.content}</s>\n" for i, m in enumerate(chat)]
    return "".join(out) + ("<s>assistant\n" if add_ass else "")


def _orion(chat: Sequence[Message], add_ass: bool) -> str:
    out, system = [], ""
    for m in chat:
        if m.role == "system":
            system += m.content
        elif m.role == "user":
            out.append("Human: ")
            if system:
                out.append(system + "\n\n")
                system = ""
            out.append(m.content + "\n\nAssistant: </s>")
        else:
            out.append(m.content + "</s>")
    return "".join(out)


def _openchat(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for m in chat:
        if m.role == "system":
            out.append(m.content + "<|end_of_turn|>")
        else:
            role = m.role[:1].upper() + m.role[1:]
            out.append(f"GPT4 Correct {role}: {m.content}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add_ass else "")


def _vicuna(orca: bool) -> Builtin:
    def render(chat: Sequence[Message], add_ass: bool) -> str:
        out = []
        for m in chat:
            if m.role == "system":
                out.append(f"SYSTEM: {m.content}\n" if orca else m.content + "\n\n")
            elif m.role == "user":
                out.append(f"USER: {m.content}\n")
            elif m.role == "assistant":
                out.append(f"ASSISTANT: {m.content}</s>\n")
        return "".join(out) + ("ASSISTANT:" if add_ass else "")

    return render


def _deepseek(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for m in chat:
        if m.role == "system":
            out.append(m.content)
        elif m.role == "user":
            out.append(f"### Instruction:\n{m.content}\n")
        elif m.role == "assistant":
            out.append(f"### Response:\n{m.content}\n<|EOT|>\n")
    return "".join(out) + ("### Response:\n" if add_ass else "")


def _deepseek2(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for m in chat:
        if m.role == "system":
            out.append(m.content + "\n\n")
        elif m.role == "user":
            out.append(f"User: {m.content}\n\n")
        elif m.role == "assistant":
            out.append(f"Assistant: {m.content}<｜end▁of▁sentence｜>")
    return "".join(out) + ("Assistant:" if add_ass else "")


def _deepseek3(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for m in chat:
        if m.role == "system":
            out.append(m.content + "\n\n")
        elif m.role == "user":
            out.append("<｜User｜>" + m.content)
        elif m.role == "assistant":
            out.append(f"<｜Assistant｜>{m.content}<｜end▁of▁sentence｜>")
    return "".join(out) + ("<｜Assistant｜>" if add_ass else "")


def _command_r(chat: Sequence[Message], add_ass: bool) -> str:
    tokens = {"system": "<|SYSTEM_TOKEN|>", "user": "<|USER_TOKEN|>", "assistant": "<|CHATBOT_TOKEN|>"}
    out = [f"<|START_OF_TURN_TOKEN|>{tokens[m.role]}{_trim(m.content)}<|END_OF_TURN_TOKEN|>"
           for m in chat if m.role in tokens]
    return "".join(out) + ("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" if add_ass else "")


def _chatglm3(chat: Sequence[Message], add_ass: bool) -> str:
    out = ["[gMASK]sop"] + [f"<|{m.role}|>\n {m.content}" for m in chat]
    return "".join(out) + ("<|assistant|>" if add_ass else "")


def _chatglm4(chat: Sequence[Message], add_ass: bool) -> str:
    out = ["[gMASK]<sop>"] + [f"<|{m.role}|>\n{m.content}" for m in chat]
    return "".join(out) + ("<|assistant|>\n" if add_ass else "")


def _minicpm(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for m in chat:
        out.append(f"<用户>{_trim(m.content)}<AI>" if m.role == "user" else _trim(m.content))
    return "".join(out)


def _exaone(tool: bool) -> Builtin:
    def render(chat: Sequence[Message], add_ass: bool) -> str:
        out = []
        for m in chat:
            content = _trim(m.content)
            if m.role == "system":
                out.append(f"[|system|]{content}[|endofturn|]\n")
            elif m.role == "user":
                out.append(f"[|user|]{content}\n")
            elif m.role == "assistant":
                out.append(f"[|assistant|]{content}[|endofturn|]\n")
            elif m.role == "tool" and tool:
                out.append(f"[|tool|]{content}[|endofturn|]\n")
        return "".join(out) + ("[|assistant|]" if add_ass else "")

    return render


def _granite(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for m in chat:
        out.append(f"<|start_of_role|>{m.role}<|end_of_role|>")
        if m.role == "assistant_tool_call":
            out.append("<|tool_call|>")
        out.append(m.content + "<|end_of_text|>\n")
    return "".join(out) + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")


def _smolvlm(chat: Sequence[Message], add_ass: bool) -> str:
    out = ["<|im_start|>"]
    for m in chat:
        if m.role == "system":
            out.append(m.content + "\n\n")
        elif m.role == "user":
            out.append(f"User: {m.content}<end_of_utterance>\n")
        else:
            out.append(f"Assistant: {m.content}<end_of_utterance>\n")
    return "".join(out) + ("Assistant:" if add_ass else "")


_BUILTINS: dict[str, Builtin] = {
    "chatml": _chatml,
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral("v1"),
    "mistral-v3": _mistral("v3"),
    "mistral-v3-tekken": _mistral("v3-tekken"),
    "mistral-v7": _mistral_v7(tekken=False),
    "mistral-v7-tekken": _mistral_v7(tekken=True),
    "phi3": _role_lines("<|", "|>\n", "<|end|>\n", "<|assistant|>\n"),
    "phi4": _role_lines("<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _role_lines("<|", "|>\n", "\n", "<|assistant|>\n"),
    "zephyr": _role_lines("<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _vicuna(orca=False),
    "vicuna-orca": _vicuna(orca=True),
    "deepseek": _deepseek,
    "deepseek2": _deepseek2,
    "deepseek3": _deepseek3,
    "command-r": _command_r,
    "llama3": _role_lines("<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
                          "<|start_header_id|>assistant<|end_header_id|>\n\n", trim=True),
    "chatglm3": _chatglm3,
    "chatglm4": _chatglm4,
    "glmedge": _role_lines("<|", "|>\n", "", "<|assistant|>"),
    "minicpm": _minicpm,
    "exaone3": _exaone(tool=False),
    "exaone4": _exaone(tool=True),
    "granite": _granite,
    "megrez": _role_lines("<|role_start|>", "<|role_end|>", "<|turn_end|>", "<|role_start|>assistant<|role_end|>"),
    "llama4": _role_lines("<|header_start|>", "<|header_end|>\n\n", "<|eot|>",
                          "<|header_start|>assistant<|header_end|>\n\n", trim=True),
    "smolvlm": _smolvlm,
}
NAMES = tuple(_BUILTINS)

# general.architecture -> the built-in its chat models use. Only architectures with one chat
# format; "llama" (Llama 2 and 3, Mistral, SmolLM, base models) is deliberately absent.
BY_ARCHITECTURE: dict[str, str] = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml",
    "phi3": "phi3",
    "command-r": "command-r", "cohere2": "command-r",
    "exaone": "exaone3", "exaone4": "exaone4",
    "granite": "granite", "granitemoe": "granite",
    "llama4": "llama4",
    "chatglm": "chatglm4",
}


def for_architecture(architecture: str) -> str | None:
    """The built-in's name for a GGUF's ``general.architecture``, or None."""
    return BY_ARCHITECTURE.get(architecture)


def apply(name: str, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """Render ``messages`` with the built-in ``name`` (a KeyError for an unknown name)."""
    return _BUILTINS[name](messages, add_generation_prompt)
