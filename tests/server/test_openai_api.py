"""The server as the official `openai` Python client sees it, on the bundled tiny model: model list,
completions and chat, streaming and not, usage, stop strings and stop ids, sampling seeds, logprobs,
tokenize / detokenize. The model is random, so expectations are relations the server must keep (a
stream carries exactly the non-streamed answer; a stop string cuts the text right before its first
occurrence; ...), computed from the server's own greedy output."""
import json
import subprocess
import unittest

import jsonschema
import openai

from server_harness import TINY_MODEL, Server, helixlm_binary

NAME = "kimi-tiny"
PROMPT = [5, 17, 300, 41, 7]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}


def setUpModule():
    global SERVER, CLIENT
    SERVER = Server("--served-model-name", NAME, "--max-model-len", "1024")
    CLIENT = openai.OpenAI(base_url=SERVER.base + "/v1", api_key="unused", max_retries=0)


def tearDownModule():
    SERVER.__exit__(None, None, None)


def token_ids(choice):
    return choice.model_extra["token_ids"]


def chat(**kw):
    return CLIENT.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hello there"}], **kw)


class Completions(unittest.TestCase):
    def test_models_lists_the_served_name(self):
        models = CLIENT.models.list().data
        self.assertEqual([m.id for m in models], [NAME])

    def test_non_streaming_answer_and_usage(self):
        r = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, **GREEDY)
        self.assertEqual(r.object, "text_completion")
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(len(token_ids(choice)), 8)
        self.assertEqual((r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens), (5, 8, 13))

    def test_stream_carries_exactly_the_non_streamed_answer(self):
        whole = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, **GREEDY)
        chunks = list(CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, stream=True,
                                                stream_options={"include_usage": True}, **GREEDY))
        ids = [i for c in chunks if c.choices for i in token_ids(c.choices[0])]
        self.assertEqual(ids, token_ids(whole.choices[0]))
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), whole.choices[0].text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finishes[-1], "length")
        self.assertTrue(all(f is None for f in finishes[:-1]))
        # The usage chunk comes last, with no choices.
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertEqual(chunks[-1].usage.prompt_tokens, 5)

    def test_stop_token_ids_end_at_their_first_occurrence(self):
        ref = token_ids(CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, **GREEDY).choices[0])
        stop = ref[5]
        r = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True,
                                                  "stop_token_ids": [stop]})
        end = ref.index(stop)
        self.assertEqual(token_ids(r.choices[0]), ref[:end + 1])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.completion_tokens, end + 1)

    def test_seeded_sampling_is_reproducible(self):
        def sample(seed):
            r = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=1.0, top_p=0.95,
                                          seed=seed, extra_body={"top_k": 50, "return_token_ids": True,
                                                                 "ignore_eos": True})
            return token_ids(r.choices[0])

        self.assertEqual(sample(7), sample(7))
        self.assertNotEqual(sample(7), sample(8))

    def test_n_choices_for_each_prompt_of_a_batch(self):
        prompts = [PROMPT, [9, 8, 7]]
        alone = [token_ids(CLIENT.completions.create(model=NAME, prompt=p, max_tokens=6, **GREEDY).choices[0])
                 for p in prompts]
        r = CLIENT.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=6, **GREEDY)
        # Choice i·n + j is prompt i's j-th; greedy choices of one prompt are its answer alone.
        self.assertEqual([c.index for c in r.choices], [0, 1, 2, 3])
        self.assertEqual([token_ids(c) for c in r.choices], [alone[0], alone[0], alone[1], alone[1]])
        self.assertEqual([c.model_extra["prompt_token_ids"] for c in r.choices], [PROMPT, PROMPT, [9, 8, 7], [9, 8, 7]])
        self.assertEqual((r.usage.prompt_tokens, r.usage.completion_tokens), (8, 24))
        chunks = list(CLIENT.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=6, stream=True,
                                                stream_options={"include_usage": True}, **GREEDY))
        streamed = {i: [] for i in range(4)}
        finishes = {}
        for c in chunks[:-1]:
            choice = c.choices[0]
            streamed[choice.index] += token_ids(choice)
            if choice.finish_reason:
                self.assertNotIn(choice.index, finishes)
                finishes[choice.index] = choice.finish_reason
        self.assertEqual(streamed, {i: token_ids(c) for i, c in enumerate(r.choices)})
        self.assertEqual(finishes, {i: "length" for i in range(4)})
        self.assertEqual((chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens), (8, 24))

    def test_sampled_choices_differ_and_share_the_seed(self):
        def sample(n):
            r = CLIENT.completions.create(model=NAME, prompt=PROMPT, n=n, max_tokens=16, temperature=1.0, seed=7,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
            return [token_ids(c) for c in r.choices]

        three = sample(3)
        self.assertEqual(three, sample(3))
        # Choice 0 draws the stream a request of one choice draws; the others streams of their own.
        self.assertEqual(three[0], sample(1)[0])
        self.assertEqual(len({tuple(ids) for ids in three}), 3, three)

    def test_best_of_answers_with_its_most_likely_sequences(self):
        # With the seed and the choices' streams, best_of 3 draws the sequences n = 3 draws: its answer must
        # be their n most likely by the sum of the sampled tokens' log-probabilities, best first.
        # A seed whose ranking differs from the choices' order, so that an unranked answer would fail.
        args = {"model": NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0,
                "extra_body": {"ignore_eos": True, "return_token_ids": True}}
        for seed in range(20):
            every = CLIENT.completions.create(n=3, logprobs=0, seed=seed, **args)
            ranked = sorted(every.choices, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
            if [c.index for c in ranked[:2]] != [0, 1]:
                break
        else:
            self.fail("no seed in 0..19 ranks the choices out of their order")
        args["seed"] = seed
        best = CLIENT.completions.create(n=2, best_of=3, logprobs=0, **args)
        self.assertEqual([c.index for c in best.choices], [0, 1])
        self.assertEqual([token_ids(c) for c in best.choices], [token_ids(c) for c in ranked[:2]])
        self.assertEqual([c.logprobs.token_logprobs for c in best.choices],
                         [c.logprobs.token_logprobs for c in ranked[:2]])
        self.assertEqual(best.usage.completion_tokens, 18)  # every sequence generated counts
        # Without logprobs asked, the ranking's log-probabilities stay out of the answer.
        one = CLIENT.completions.create(best_of=3, **args)
        self.assertEqual([token_ids(c) for c in one.choices], [token_ids(ranked[0])])
        self.assertIsNone(one.choices[0].logprobs)

    def test_logit_bias_and_penalties_steer_the_draws(self):
        ref = token_ids(CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, **GREEDY).choices[0])
        forced = 8 if ref[0] == 7 else 7
        r = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, logit_bias={str(forced): 100},
                                      frequency_penalty=2.0, logprobs=0, **GREEDY)
        ids = token_ids(r.choices[0])
        self.assertEqual(ids[0], forced)
        # Log-probabilities are the raw logits': the forced token was not the model's choice.
        self.assertLess(r.choices[0].logprobs.token_logprobs[0], 0.0)
        # Penalties and min_p sample on the host; with a seed they are as reproducible as any draw.
        def sampled():
            return token_ids(CLIENT.completions.create(
                model=NAME, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3, presence_penalty=1.5,
                extra_body={"repetition_penalty": 1.3, "min_p": 0.05, "ignore_eos": True,
                            "return_token_ids": True}).choices[0])
        self.assertEqual(sampled(), sampled())
        # min_tokens holds back a stop id the model would take at once.
        r = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                                      extra_body={"stop_token_ids": [ref[0]], "min_tokens": 3,
                                                  "return_token_ids": True, "ignore_eos": True})
        self.assertGreaterEqual(r.usage.completion_tokens, 4)
        self.assertNotIn(ref[0], token_ids(r.choices[0])[:3])

    def test_logprobs_of_greedy_tokens_are_the_best(self):
        r = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, logprobs=3, **GREEDY)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.token_logprobs), 4)
        for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
            # The legacy format keys alternatives by text: tokens that decode alike share one entry.
            self.assertIn(len(top), (1, 2, 3))
            self.assertAlmostEqual(chosen, max(top.values()), places=5)
            self.assertLess(chosen, 0.0)

    def test_default_max_tokens_is_sixteen(self):
        r = CLIENT.completions.create(model=NAME, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 16)

    def test_refusals_raise_the_clients_errors(self):
        with self.assertRaises(openai.BadRequestError):
            CLIENT.completions.create(model=NAME, prompt=PROMPT, n=2, best_of=1)
        with self.assertRaises(openai.BadRequestError):  # the best are known only at the end
            CLIENT.completions.create(model=NAME, prompt=PROMPT, best_of=2, stream=True)
        with self.assertRaises(openai.BadRequestError):  # more choices than the server holds at once
            CLIENT.completions.create(model=NAME, prompt=PROMPT, n=1000)
        with self.assertRaises(openai.NotFoundError):
            CLIENT.completions.create(model="gpt-4", prompt=PROMPT)


class Text(unittest.TestCase):
    """Needs the bundled model's tokenizer."""

    def test_tokenizer_info_names_the_special_tokens(self):
        # What lm-eval's tokenizer_backend=remote reads, with /tokenize and /detokenize.
        status, info = SERVER.get("/tokenizer_info")
        self.assertEqual(status, 200, info)
        self.assertEqual((info["bos_token"], info["eos_token"]), ("[BOS]", "<|im_end|>"))
        self.assertIsNone(info["chat_template"])  # the bundled model ships no Jinja template
        status, tok = SERVER.post("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
        self.assertEqual(status, 200, tok)
        self.assertEqual(len(tok["tokens"]), 1)  # the special token, as lm-eval's eos_token_id expects
        status, text = SERVER.post("/detokenize", {"tokens": tok["tokens"]})
        self.assertEqual(text["prompt"], info["eos_token"])
        # A completion prompt reads special-token strings as those tokens too; parse_special false keeps text.
        r = CLIENT.completions.create(model=NAME, prompt="Hi" + info["eos_token"], max_tokens=1, **GREEDY)
        self.assertEqual(r.choices[0].model_extra["prompt_token_ids"][-1], tok["tokens"][0])
        status, plain = SERVER.post("/tokenize", {"content": info["eos_token"], "parse_special": False})
        self.assertGreater(len(plain["tokens"]), 1)

    def test_text_prompt_is_tokenized_as_tokenize_says(self):
        status, tok = SERVER.post("/tokenize", {"content": "Hello, world"})
        self.assertEqual(status, 200, tok)
        r = CLIENT.completions.create(model=NAME, prompt="Hello, world", max_tokens=2, **GREEDY)
        self.assertEqual(r.usage.prompt_tokens, tok["count"])
        self.assertEqual(r.choices[0].model_extra["prompt_token_ids"], tok["tokens"])
        status, detok = SERVER.post("/detokenize", {"tokens": tok["tokens"]})
        self.assertEqual(status, 200)
        self.assertEqual(detok["content"], "Hello, world")

    def test_chat_stream_carries_exactly_the_non_streamed_answer(self):
        whole = chat(max_tokens=12, **GREEDY)
        self.assertEqual(whole.object, "chat.completion")
        msg = whole.choices[0].message
        self.assertEqual(msg.role, "assistant")
        chunks = list(chat(max_tokens=12, stream=True, stream_options={"include_usage": True}, **GREEDY))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
                            if c.choices)
        self.assertEqual(content, msg.content or "")
        self.assertEqual(reasoning, (msg.model_extra or {}).get("reasoning_content") or "")
        ids = [i for c in chunks if c.choices for i in c.choices[0].model_extra.get("token_ids", [])]
        self.assertEqual(ids, token_ids(whole.choices[0]))
        self.assertEqual(chunks[-1].usage.total_tokens, whole.usage.total_tokens)
        self.assertEqual(whole.usage.completion_tokens, 12)

    def test_stop_string_cuts_before_its_first_occurrence(self):
        full = CLIENT.completions.create(model=NAME, prompt="Once upon a time", max_tokens=40,
                                         **GREEDY).choices[0].text
        # A stop string from the middle of the greedy text (the model is random: any text will do).
        text = full.replace("\ufffd", "")
        self.assertGreater(len(text), 6, repr(full))
        stop = text[len(text) // 2:len(text) // 2 + 2]
        expected = full[:full.find(stop)]
        for stream in (False, True):
            # Each of n choices matches on its own.
            r = CLIENT.completions.create(model=NAME, prompt="Once upon a time", max_tokens=40, stop=[stop],
                                          stream=stream, n=2, **GREEDY)
            if stream:
                chunks = [c for c in r if c.choices]
                got = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)]
                finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
            else:
                got, finish = [c.text for c in r.choices], [c.finish_reason for c in r.choices]
            self.assertEqual(got, [expected, expected], (stream, stop, full))
            self.assertEqual(finish, ["stop", "stop"])
        # vLLM's include_stop_str_in_output keeps the matched string.
        r = CLIENT.completions.create(model=NAME, prompt="Once upon a time", max_tokens=40, stop=[stop],
                                      temperature=0, extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
        self.assertEqual(r.choices[0].text, expected + stop)

    def test_apply_template_gives_the_prompt_a_chat_runs_on(self):
        # llama-server's /apply-template: read back as a completion prompt, its text is the rendered ids (a
        # message's text that spells a special token would read back as that token: chat keeps it as text).
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
        status, applied = SERVER.post("/apply-template", {"messages": messages})
        self.assertEqual(status, 200, applied)
        status, rendered = SERVER.post("/tokenize", {"messages": messages})
        self.assertEqual(status, 200, rendered)
        r = CLIENT.completions.create(model=NAME, prompt=applied["prompt"], max_tokens=1, **GREEDY)
        self.assertEqual(r.choices[0].model_extra["prompt_token_ids"], rendered["tokens"])
        status, bare = SERVER.post("/apply-template", {"messages": messages, "add_generation_prompt": False})
        self.assertTrue(applied["prompt"].startswith(bare["prompt"]) and applied["prompt"] != bare["prompt"])
        status, err = SERVER.post("/apply-template", {"messages": messages, "tools": []})
        self.assertEqual((status, err["error"]["param"]), (400, "tools"))

    def test_prompt_logprobs_are_the_echoed_scores_with_ranks(self):
        # vLLM's prompt_logprobs: per position a dict keyed by token id, the prompt's token with its rank
        # and the alternatives ranked 1, 2, ...; the values are those echo with logprobs reports.
        prompt = [5, 17, 300, 41, 7, 99, 12]
        echoed = CLIENT.completions.create(model=NAME, prompt=prompt, max_tokens=1, logprobs=2, echo=True, **GREEDY)
        r = CLIENT.completions.create(model=NAME, prompt=prompt, max_tokens=0, temperature=0,
                                      extra_body={"prompt_logprobs": 2})
        self.assertEqual(r.usage.completion_tokens, 0)
        plp = r.choices[0].model_extra["prompt_logprobs"]
        self.assertEqual(len(plp), len(prompt))
        self.assertIsNone(plp[0])
        for i in range(1, len(prompt)):
            entry = plp[i]
            mine = entry[str(prompt[i])]
            self.assertAlmostEqual(mine["logprob"], echoed.choices[0].logprobs.token_logprobs[i], places=5)
            ranks = sorted(e["rank"] for e in entry.values())
            self.assertIn(ranks, ([1, 2], [1, 2, mine["rank"]]))
            self.assertGreaterEqual(mine["rank"], 1)
            best = min(entry.values(), key=lambda e: e["rank"])
            self.assertEqual(best["logprob"], max(e["logprob"] for e in entry.values()))
            if mine["rank"] > 2:  # not an alternative: the alternatives are likelier
                self.assertLess(mine["logprob"], min(e["logprob"] for e in entry.values() if e["rank"] <= 2))
        self.assertTrue(any(plp[i][str(prompt[i])]["rank"] > 2 for i in range(1, len(prompt))))
        # Chat gives them once, beside the choices, over the rendered prompt.
        c = CLIENT.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                           n=2, temperature=0,
                                           extra_body={"prompt_logprobs": 0, "return_token_ids": True})
        rendered = c.choices[0].model_extra["prompt_token_ids"]
        chat_plp = c.model_extra["prompt_logprobs"]
        self.assertEqual(len(chat_plp), len(rendered))
        self.assertIsNone(chat_plp[0])
        for i in range(1, len(rendered)):  # prompt_logprobs 0: the prompt's token alone
            self.assertEqual(list(chat_plp[i]), [str(rendered[i])])
            self.assertGreaterEqual(chat_plp[i][str(rendered[i])]["rank"], 1)

    def test_echo_scores_the_prompt_as_generation_scored_it(self):
        # How evaluation harnesses (lm-eval's local-completions) score text: echo, logprobs, one new token.
        gen = CLIENT.completions.create(model=NAME, prompt="The cat sat", max_tokens=6, logprobs=1, **GREEDY)
        ids = token_ids(gen.choices[0])
        prompt = gen.choices[0].model_extra["prompt_token_ids"]
        r = CLIENT.completions.create(model=NAME, prompt=[prompt + ids[:5]], max_tokens=1, logprobs=1, echo=True,
                                      **GREEDY)
        lp = r.choices[0].logprobs
        n = len(prompt) + 6
        self.assertEqual((len(lp.tokens), len(lp.token_logprobs), len(lp.top_logprobs)), (n, n, n))
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        # The continuation read as prompt has the log-probabilities it had when it was generated, and is greedy.
        want = gen.choices[0].logprobs.token_logprobs
        for i in range(6):
            self.assertAlmostEqual(lp.token_logprobs[len(prompt) + i], want[i], places=3)
            top = lp.top_logprobs[len(prompt) + i]
            self.assertEqual(max(top, key=top.get), lp.tokens[len(prompt) + i])
        self.assertEqual(token_ids(r.choices[0]), ids[5:6])
        self.assertEqual(r.choices[0].text, "The cat sat" + gen.choices[0].text)
        self.assertEqual(lp.text_offset[len(prompt)], len("The cat sat"))
        # Streamed, the prompt's text and entries come with the first chunk.
        # max_tokens 0: the prompt alone, scored alike.
        alone = CLIENT.completions.create(model=NAME, prompt=[prompt + ids[:5]], max_tokens=0, logprobs=1, echo=True,
                                          **GREEDY)
        self.assertEqual(alone.choices[0].finish_reason, "length")
        self.assertEqual(alone.usage.completion_tokens, 0)
        self.assertEqual(alone.choices[0].logprobs.tokens, lp.tokens[:-1])
        for a, b in zip(alone.choices[0].logprobs.token_logprobs[1:], lp.token_logprobs[1:-1]):
            self.assertAlmostEqual(a, b, places=5)
        with self.assertRaises(openai.BadRequestError):  # no tokens and nothing echoed: a mistake
            CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=0)
        whole = CLIENT.completions.create(model=NAME, prompt="The cat sat", max_tokens=3, echo=True, **GREEDY)
        chunks = [c for c in CLIENT.completions.create(model=NAME, prompt="The cat sat", max_tokens=3, echo=True,
                                                      stream=True, **GREEDY) if c.choices]
        self.assertTrue(chunks[0].choices[0].text.startswith("The cat sat"))
        self.assertEqual("".join(c.choices[0].text for c in chunks), whole.choices[0].text)

    def test_chat_choices_stream_as_they_answer_whole(self):
        one = chat(max_tokens=8, **GREEDY).choices[0].message
        whole = chat(max_tokens=8, n=2, **GREEDY)
        self.assertEqual([c.message.content for c in whole.choices], [one.content, one.content])
        chunks = [c for c in chat(max_tokens=8, n=2, stream=True, **GREEDY) if c.choices]
        for i in (0, 1):
            mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
            self.assertEqual(mine[0].delta.role, "assistant")
            self.assertEqual("".join(c.delta.content or "" for c in mine), one.content or "")
            self.assertEqual(mine[-1].finish_reason, "length")

    def test_json_object_mode_gives_json_objects(self):
        finished = 0
        for seed in range(12):
            r = chat(max_tokens=120, temperature=1.0, seed=seed, response_format={"type": "json_object"})
            text = r.choices[0].message.content
            self.assertTrue(text.lstrip().startswith("{"), repr(text))
            if r.choices[0].finish_reason == "stop":  # the object closed and the turn ended right after
                self.assertIsInstance(json.loads(text), dict, repr(text))
                finished += 1
        self.assertGreater(finished, 0)  # the random model closes some objects within 120 tokens

    def test_json_schema_mode_follows_the_schema(self):
        schema = {
            "$defs": {"Tag": {"type": "string", "maxLength": 3}},
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "kind": {"enum": ["cat", "dog", 7]},
                "size": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 2},
            },
            "required": ["name", "kind", "tags"],
            "additionalProperties": False,
        }
        fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": True}}
        finished = 0
        for seed in range(16):
            r = chat(max_tokens=60, temperature=1.0, seed=seed, response_format=fmt)
            text = r.choices[0].message.content
            self.assertTrue(text.lstrip().startswith("{"), repr(text))
            if r.choices[0].finish_reason == "stop":
                value = json.loads(text)
                jsonschema.validate(value, schema)  # an independent validator
                # Declared order, required ones present: the constraint's own promises.
                order = [k for k in schema["properties"] if k in value]
                self.assertEqual(list(value), order, repr(text))
                finished += 1
        self.assertGreater(finished, 0)
        # On /v1/completions too.
        c = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=60, temperature=0,
                                      extra_body={"response_format": fmt})
        self.assertTrue(c.choices[0].text.lstrip().startswith("{"), repr(c.choices[0].text))

    def test_vllm_guided_choice_and_structured_outputs(self):
        choices = ["positive", "negative", "neutral, leaning positive"]
        for seed in range(6):
            r = chat(max_tokens=20, temperature=1.0, seed=seed, extra_body={"guided_choice": choices})
            self.assertIn(r.choices[0].message.content, choices)
            self.assertEqual(r.choices[0].finish_reason, "stop")
        c = CLIENT.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, temperature=0,
                                      extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        self.assertIn(c.choices[0].text, ("yes", "no"))
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        finished = 0
        for seed in range(8):
            r = chat(max_tokens=40, temperature=1.0, seed=seed, extra_body={"guided_json": schema})
            if r.choices[0].finish_reason == "stop":
                jsonschema.validate(json.loads(r.choices[0].message.content), schema)
                finished += 1
        self.assertGreater(finished, 0)
        for extra in ({"guided_regex": "a+"}, {"guided_choice": ["a"], "guided_json": schema},
                      {"structured_outputs": {"grammar": "root ::= x"}}):
            with self.assertRaises(openai.BadRequestError):
                chat(max_tokens=4, extra_body=extra)

    def test_json_schema_mode_refuses_what_it_cannot_follow_by_name(self):
        def refused(schema):
            with self.assertRaises(openai.BadRequestError) as e:
                chat(max_tokens=4, response_format={"type": "json_schema",
                                                    "json_schema": {"name": "x", "schema": schema}})
            return str(e.exception)

        self.assertIn('response_format.json_schema.schema.properties.age: "minimum" is not supported',
                      refused({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}))
        self.assertIn("may both begin with", refused({"anyOf": [{"type": "integer"}, {"type": "number"}]}))
        with self.assertRaises(openai.BadRequestError):
            chat(max_tokens=4, response_format={"type": "json_schema", "json_schema": {"name": "x"}})
        with self.assertRaises(openai.BadRequestError):
            chat(max_tokens=4, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
                 extra_body={"ignore_eos": True})

    def test_chat_logprobs(self):
        r = chat(max_tokens=3, logprobs=True, top_logprobs=2, **GREEDY)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 3)
        for entry in content:
            self.assertEqual(len(entry.top_logprobs), 2)
            self.assertAlmostEqual(entry.logprob, entry.top_logprobs[0].logprob, places=5)

    def test_tools_are_accepted(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]
        r = chat(max_tokens=4, tools=tools, **GREEDY)
        self.assertIn(r.choices[0].finish_reason, ("length", "stop", "tool_calls"))

    TOOLS = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                             "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
        {"type": "function", "function": {"name": "get_time"}},
    ]

    def forced_calls(self, tool_choice, **kw):
        """The tool calls of the seeds whose section closed within max_tokens (finish_reason tool_calls)."""
        finished = []
        for seed in range(12):
            r = chat(max_tokens=80, temperature=1.0, seed=seed, tools=self.TOOLS, tool_choice=tool_choice, **kw)
            choice = r.choices[0]
            if choice.finish_reason == "tool_calls":
                self.assertFalse(choice.message.content, repr(choice.message.content))
                finished.append(choice.message.tool_calls)
            else:
                self.assertEqual(choice.finish_reason, "length")
        self.assertGreater(len(finished), 0)  # the random model closes some sections within 80 tokens
        schemas = {t["function"]["name"]: t["function"].get("parameters", {"type": "object",
                                                                           "additionalProperties": False})
                   for t in self.TOOLS}
        for calls in finished:
            self.assertGreater(len(calls), 0)
            for call in calls:
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        return finished

    def test_a_named_tool_choice_makes_exactly_one_call_to_it(self):
        named = {"type": "function", "function": {"name": "get_weather"}}
        for calls in self.forced_calls(named):
            self.assertEqual([c.function.name for c in calls], ["get_weather"])

    def test_required_makes_one_or_more_calls_to_the_tools(self):
        for calls in self.forced_calls("required"):
            self.assertTrue(all(c.function.name in ("get_weather", "get_time") for c in calls))
        for calls in self.forced_calls("required", parallel_tool_calls=False):
            self.assertEqual(len(calls), 1)

    def test_forcing_a_tool_is_refused_where_it_cannot_be_followed(self):
        def refused(**kw):
            with self.assertRaises(openai.BadRequestError) as e:
                chat(max_tokens=4, **kw)
            return e.exception.body

        self.assertEqual(refused(tool_choice="required")["param"], "tools")
        self.assertEqual(refused(tools=self.TOOLS, tool_choice={"type": "function",
                                                                "function": {"name": "get_news"}})["param"],
                         "tool_choice")
        minimum = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}]
        body = refused(tools=minimum, tool_choice="required")
        self.assertEqual(body["param"], "tools")
        self.assertIn('tools[0].function.parameters.properties.n: "minimum" is not supported', body["message"])
        dashed = [{"type": "function", "function": {"name": "get-weather"}}]
        self.assertIn("get-weather", refused(tools=dashed, tool_choice="required")["message"])
        self.assertEqual(refused(tools=self.TOOLS, tool_choice="required",
                                 response_format={"type": "json_object"})["param"], "tool_choice")

    def test_helixlm_chat_answers_as_the_server_does(self):
        whole = chat(max_tokens=12, **GREEDY).choices[0].message
        reasoning = (whole.model_extra or {}).get("reasoning_content")
        expected = (f"[{reasoning}]" if reasoning else "") + (whole.content or "")
        run = subprocess.run([helixlm_binary(), "chat", "-m", TINY_MODEL, "-n", "12"], input="Hello there\n",
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout, expected + "\n")


if __name__ == "__main__":
    unittest.main()
