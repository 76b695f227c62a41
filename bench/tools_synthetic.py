"""Synthetic tool-calling conversations: plain requests, several calls, near misses, answers after results.

Training data for the tools adapter beside the BFCL development rows (bench/tools_data.py).
BFCL teaches long, technical function specs; it has no everyday one-tool requests ("What is
the weather in Riga today?"), no conversations that already hold a tool's result, and its
irrelevance rows are far from the tools offered. Every row here is generated from word
lists and templates, so we may use it freely, in the ``{messages, tools, output}`` format of
``train_tools_adapter``:

- ``single``: one request for one tool, among 0-3 other tools;
- ``parallel``: the same tool asked for two or three values ("in Riga and in Oslo");
- ``multi``: two different tools in one request;
- ``irrelevant``: a question none of the offered tools answers (general chat, and near misses:
  a population question beside a weather tool); the answer is one fixed sentence, as in
  bench/tools_data.py (answers are written by the base weights; the adapter decides *whether*);
- ``after_result``: the call was made and its result is in the conversation; the turn is
  the answer that reports it.

String arguments are verbatim spans of the request (as grounded tool arguments write them),
numbers as printed.

    python bench/tools_synthetic.py 5       # print five rows
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NO_TOOL_ANSWER = "I can't do that with the tools I have."

CITIES = (
    "Riga|Oslo|Paris|Tokyo|Nairobi|Lima|Toronto|Berlin|Madrid|Seoul|Cairo|Sydney|Dublin|"
    "Lisbon|Prague|Austin|Denver|Mumbai|Hanoi|Quito|Kyoto|Porto|Krakow|Boston"
).split("|")
COUNTRIES = "France|Japan|Kenya|Peru|Canada|Germany|Brazil|India|Norway|Vietnam|Egypt|Chile|Poland|Mexico".split("|")
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "INR", "MYR"]
SYMBOLS = ["AAPL", "MSFT", "TSLA", "NVDA", "AMZN", "GOOG", "IBM", "SAP"]
LANGUAGES = ["French", "Spanish", "German", "Japanese", "Italian", "Chinese", "Polish", "Dutch"]
PHRASES = ["good morning", "where is the station", "thank you very much", "I would like a coffee", "see you tomorrow"]
NAMES = "Anna|Ben|Carla|David|Elena|Farid|Grace|Hiro|Ines|Jonas|Mei|Noah|Olga|Rosa|Sven|Uma".split("|")
DOMAINS = ["example.com", "mail.org", "acme.io", "school.edu"]
TOPICS = ["the budget", "tomorrow's meeting", "the trip", "the invoice", "lunch", "the report"]
QUERIES = (
    "best hiking trails near Denver|how to repot a cactus|latest electric car reviews|"
    "history of the printing press|cheap flights to Lisbon|symptoms of dehydration"
).split("|")
RESTAURANTS = ["Luigi's", "The Green Fork", "Sakura House", "Casa Blanca", "Blue Lagoon Grill"]
TIMES = ["7pm", "8:30pm", "noon", "6 pm", "19:00", "1:15pm"]
DAYS = ["Monday", "Friday", "tomorrow", "next Tuesday", "June 3", "March 14"]
TASKS = ["call the dentist", "water the plants", "pay the rent", "buy milk", "send the report", "book the flights"]
SONGS = [("Yesterday", "The Beatles"), ("Halo", "Beyonce"), ("Clocks", "Coldplay"), ("Hello", "Adele")]
INGREDIENTS = ["chicken", "tofu", "lentils", "salmon", "mushrooms", "rice", "spinach"]
TRACKING = ["1Z999AA10123456784", "JD014600003828", "9400111899223197", "LX123456789DE"]

IRRELEVANT = (
    "Tell me a joke.|Who wrote Hamlet?|How are you today?|Write a haiku about the sea.|"
    "What does the word ephemeral mean?|Summarize the story of Cinderella in one sentence.|"
    "What is the capital of Australia?|Why is the sky blue?|Give me three tips for better sleep.|"
    "Who painted the Mona Lisa?|What is photosynthesis?|Can you recommend a good book?|"
    "How many legs does a spider have?|Say hello in Japanese.|"
    "What's your favourite colour?|Explain gravity to a child.|Thanks, that's all for now."
).split("|")


@dataclass(frozen=True)
class Kind:
    """One tool: its spec, a request for it, a near-miss question it cannot answer, its result."""

    name: str
    description: str
    parameters: dict[str, Any]
    request: Callable[[random.Random], tuple[str, dict[str, Any]]]
    near_miss: Callable[[random.Random], str]
    result: Callable[[dict[str, Any], random.Random], tuple[str, str]]

    def spec(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


def _weather(r: random.Random) -> tuple[str, dict[str, Any]]:
    city = r.choice(CITIES)
    if r.random() < 0.3:
        unit = r.choice(["celsius", "fahrenheit"])
        t = r.choice(["How warm is it in {c} in {u}?", "Give me the temperature in {c} in {u}."])
        return t.format(c=city, u=unit), {"city": city, "unit": unit}
    t = r.choice(
        [
            "What is the weather in {c} today?",
            "What's the weather like in {c}?",
            "Is it raining in {c}?",
            "weather in {c}",
            "Do I need an umbrella in {c} today?",
            "How's the weather in {c} right now?",
        ]
    )
    return t.format(c=city), {"city": city}


def _currency(r: random.Random) -> tuple[str, dict[str, Any]]:
    amount = r.choice([r.randint(5, 2000), round(r.uniform(1, 500), 2)])
    a, b = r.sample(CURRENCIES, 2)
    t = r.choice(["Convert {n} {a} to {b}.", "How much is {n} {a} in {b}?", "What are {n} {a} worth in {b}?"])
    return t.format(n=amount, a=a, b=b), {"amount": amount, "from_currency": a, "to_currency": b}


def _email(r: random.Random) -> tuple[str, dict[str, Any]]:
    to = f"{r.choice(NAMES).lower()}@{r.choice(DOMAINS)}"
    subject = r.choice(TOPICS)
    body = r.choice(["I will be late", "the file is attached", "see you at 10", "please call me back"])
    t = r.choice(["Send an email to {to} about {s} saying {b}.", "Email {to} with the subject {s}: {b}."])
    return t.format(to=to, s=subject, b=body), {"to": to, "subject": subject, "body": body}


def _timer(r: random.Random) -> tuple[str, dict[str, Any]]:
    n = r.choice([1, 3, 5, 10, 15, 20, 25, 30, 45, 90])
    t = r.choice(["Set a timer for {n} minutes.", "Start a {n} minute timer.", "Timer {n} minutes please."])
    return t.format(n=n), {"minutes": n}


def _search(r: random.Random) -> tuple[str, dict[str, Any]]:
    q = r.choice(QUERIES)
    t = r.choice(["Search the web for {q}.", "Look up {q} online.", "Find me results on {q}."])
    return t.format(q=q), {"query": q}


def _stock(r: random.Random) -> tuple[str, dict[str, Any]]:
    s = r.choice(SYMBOLS)
    t = r.choice(
        ["What's the stock price of {s}?", "How is {s} trading today?", "Get me the current price of {s} shares."]
    )
    return t.format(s=s), {"symbol": s}


def _translate(r: random.Random) -> tuple[str, dict[str, Any]]:
    p, lang = r.choice(PHRASES), r.choice(LANGUAGES)
    t = r.choice(['Translate "{p}" into {l}.', "How do you say {p} in {l}?"])
    return t.format(p=p, l=lang), {"text": p, "target_language": lang}


def _table(r: random.Random) -> tuple[str, dict[str, Any]]:
    rest, n, tm = r.choice(RESTAURANTS), r.randint(2, 8), r.choice(TIMES)
    t = r.choice(["Book a table for {n} at {r} at {t}.", "Reserve {r} for {n} people at {t}."])
    return t.format(n=n, r=rest, t=tm), {"restaurant": rest, "people": n, "time": tm}


def _circle(r: random.Random) -> tuple[str, dict[str, Any]]:
    rad = r.choice([2, 3, 4.5, 7, 10, 12.5])
    t = r.choice(["What's the area of a circle with radius {x}?", "Calculate the area of a circle of radius {x}."])
    return t.format(x=rad), {"radius": rad}


def _directions(r: random.Random) -> tuple[str, dict[str, Any]]:
    a, b = r.sample(CITIES, 2)
    mode = r.choice(["driving", "walking", "transit"])
    t = r.choice(["How do I get from {a} to {b} by {m}?", "Directions from {a} to {b}, {m} please."])
    return t.format(a=a, b=b, m=mode), {"origin": a, "destination": b, "mode": mode}


def _reminder(r: random.Random) -> tuple[str, dict[str, Any]]:
    task, day = r.choice(TASKS), r.choice(DAYS)
    t = r.choice(["Remind me to {x} on {d}.", "Set a reminder to {x} {d}."]).replace("on tomorrow", "tomorrow")
    text = t.format(x=task, d=day).replace("on tomorrow", "tomorrow").replace("on next", "next")
    return text, {"task": task, "date": day}


def _music(r: random.Random) -> tuple[str, dict[str, Any]]:
    song, artist = r.choice(SONGS)
    t = r.choice(["Play {s} by {a}.", "Put on {s} by {a}, please."])
    return t.format(s=song, a=artist), {"song": song, "artist": artist}


def _factorial(r: random.Random) -> tuple[str, dict[str, Any]]:
    n = r.randint(3, 20)
    t = r.choice(["Calculate the factorial of {n}.", "What is {n} factorial?", "Compute {n}!"])
    return t.format(n=n), {"n": n}


def _population(r: random.Random) -> tuple[str, dict[str, Any]]:
    c, y = r.choice(COUNTRIES), r.randint(1950, 2023)
    t = r.choice(["What was the population of {c} in {y}?", "How many people lived in {c} in {y}?"])
    return t.format(c=c, y=y), {"country": c, "year": y}


def _recipes(r: random.Random) -> tuple[str, dict[str, Any]]:
    i, mins = r.choice(INGREDIENTS), r.choice([15, 20, 30, 45, 60])
    t = r.choice(["Find recipes with {i} that take under {m} minutes.", "Any {i} recipes I can cook in {m} minutes?"])
    return t.format(i=i, m=mins), {"ingredient": i, "max_minutes": mins}


def _package(r: random.Random) -> tuple[str, dict[str, Any]]:
    n = r.choice(TRACKING)
    t = r.choice(["Where is my package {n}?", "Track parcel {n}.", "What's the status of shipment {n}?"])
    return t.format(n=n), {"tracking_number": n}


def _add(r: random.Random) -> tuple[str, dict[str, Any]]:
    a, b = r.choice([(r.randint(2, 99), r.randint(2, 99)), (r.randint(100, 5000), r.randint(10, 999))])
    t = r.choice(["What is {a} plus {b}?", "Add {a} and {b}.", "What's {a} + {b}?", "What is the sum of {a} and {b}?"])
    return t.format(a=a, b=b), {"a": a, "b": b}


def _multiply(r: random.Random) -> tuple[str, dict[str, Any]]:
    a, b = r.randint(2, 99), r.randint(2, 99)
    t = r.choice(["What is {a} times {b}?", "Multiply {a} by {b}.", "What's {a} * {b}?", "{a} multiplied by {b}?"])
    return t.format(a=a, b=b), {"a": a, "b": b}


def _res(fmt: str, answer: str) -> Callable[[dict[str, Any], random.Random], tuple[str, str]]:
    def make(args: dict[str, Any], r: random.Random) -> tuple[str, str]:
        vals = {**args, "v": r.randint(2, 99), "w": r.choice(["sunny", "cloudy", "light rain", "snow"])}
        return fmt.format(**vals), answer.format(**vals)

    return make


S = {"type": "string"}
KINDS = [
    Kind(
        "get_weather",
        "Current weather in a city.",
        _obj(
            {"city": {**S, "description": "city name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            ["city"],
        ),
        _weather,
        lambda r: f"What is the population of {r.choice(CITIES)}?",
        _res('{{"condition": "{w}", "temperature": {v}}}', "It is {w} in {city}, {v} degrees."),
    ),
    Kind(
        "convert_currency",
        "Convert an amount of money from one currency to another.",
        _obj(
            {"amount": {"type": "number"}, "from_currency": S, "to_currency": S},
            ["amount", "from_currency", "to_currency"],
        ),
        _currency,
        lambda r: f"Which country uses the {r.choice(CURRENCIES)} as its currency?",
        _res('{{"converted": {v}.5}}', "{amount} {from_currency} is {v}.5 {to_currency}."),
    ),
    Kind(
        "send_email",
        "Send an email.",
        _obj({"to": {**S, "description": "recipient address"}, "subject": S, "body": S}, ["to", "subject", "body"]),
        _email,
        lambda r: "How do I write a polite email to my boss?",
        _res('{{"status": "sent"}}', "Done: the email to {to} is sent."),
    ),
    Kind(
        "set_timer",
        "Start a countdown timer.",
        _obj({"minutes": {"type": "integer"}}, ["minutes"]),
        _timer,
        lambda r: "How long should I boil an egg?",
        _res('{{"status": "started"}}', "Your {minutes} minute timer is running."),
    ),
    Kind(
        "search_web",
        "Search the web.",
        _obj({"query": S}, ["query"]),
        _search,
        lambda r: "What is your name?",
        _res('{{"top_result": "A guide with {v} tips"}}', "The top result is a guide with {v} tips on {query}."),
    ),
    Kind(
        "get_stock_price",
        "Latest stock price for a ticker symbol.",
        _obj({"symbol": {**S, "description": "ticker"}}, ["symbol"]),
        _stock,
        lambda r: "What is a stock, in simple words?",
        _res('{{"price": {v}.25}}', "{symbol} trades at {v}.25."),
    ),
    Kind(
        "translate_text",
        "Translate text into another language.",
        _obj({"text": S, "target_language": S}, ["text", "target_language"]),
        _translate,
        lambda r: f"Which countries speak {r.choice(LANGUAGES)}?",
        _res('{{"translation": "..."}}', "Here is the translation into {target_language}."),
    ),
    Kind(
        "book_table",
        "Reserve a table at a restaurant.",
        _obj({"restaurant": S, "people": {"type": "integer"}, "time": S}, ["restaurant", "people", "time"]),
        _table,
        lambda r: "What should I cook for dinner tonight?",
        _res('{{"confirmation": "R{v}"}}', "Booked: {restaurant} for {people} at {time}, confirmation R{v}."),
    ),
    Kind(
        "calculate_circle_area",
        "Area of a circle.",
        _obj({"radius": {"type": "number"}}, ["radius"]),
        _circle,
        lambda r: "What is the formula for the volume of a sphere?",
        _res('{{"area": {v}.7}}', "The area is {v}.7."),
    ),
    Kind(
        "get_directions",
        "Route between two places.",
        _obj(
            {"origin": S, "destination": S, "mode": {"type": "string", "enum": ["driving", "walking", "transit"]}},
            ["origin", "destination"],
        ),
        _directions,
        lambda r: f"Which country is {r.choice(CITIES)} in?",
        _res('{{"duration_minutes": {v}}}', "It takes about {v} minutes from {origin} to {destination}."),
    ),
    Kind(
        "create_reminder",
        "Create a reminder.",
        _obj({"task": S, "date": S}, ["task", "date"]),
        _reminder,
        lambda r: "Why do I keep forgetting things?",
        _res('{{"status": "saved"}}', "I'll remind you to {task} {date}."),
    ),
    Kind(
        "play_music",
        "Play a song.",
        _obj({"song": S, "artist": S}, ["song"]),
        _music,
        lambda r: "Who was the lead singer of Queen?",
        _res('{{"status": "playing"}}', "Playing {song} by {artist}."),
    ),
    Kind(
        "factorial",
        "Factorial of a non-negative integer.",
        _obj({"n": {"type": "integer"}}, ["n"]),
        _factorial,
        lambda r: "What is a prime number?",
        _res('{{"result": {v}00}}', "The factorial of {n} is {v}00."),
    ),
    Kind(
        "add",
        "Add two numbers.",
        _obj({"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]),
        _add,
        lambda r: "Who invented the pocket calculator?",
        _res('{{"result": {v}}}', "The sum is {v}."),
    ),
    Kind(
        "multiply",
        "Multiply two numbers.",
        _obj({"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]),
        _multiply,
        lambda r: "What is a prime number?",
        _res('{{"result": {v}}}', "The product is {v}."),
    ),
    Kind(
        "get_population",
        "Population of a country in a year.",
        _obj({"country": S, "year": {"type": "integer"}}, ["country", "year"]),
        _population,
        lambda r: f"What is the capital of {r.choice(COUNTRIES)}?",
        _res('{{"population": {v}000000}}', "{country} had about {v} million people in {year}."),
    ),
    Kind(
        "find_recipes",
        "Find recipes by ingredient and cooking time.",
        _obj({"ingredient": S, "max_minutes": {"type": "integer"}}, ["ingredient"]),
        _recipes,
        lambda r: "Is a tomato a fruit or a vegetable?",
        _res('{{"count": {v}}}', "I found {v} {ingredient} recipes."),
    ),
    Kind(
        "track_package",
        "Where a parcel is.",
        _obj({"tracking_number": S}, ["tracking_number"]),
        _package,
        lambda r: "How do I wrap a gift nicely?",
        _res('{{"status": "in transit"}}', "Parcel {tracking_number} is in transit."),
    ),
]

SHAPES = ("single", "parallel", "multi", "irrelevant", "after_result")
WEIGHTS = (0.32, 0.14, 0.12, 0.24, 0.18)


def _tools(r: random.Random, needed: list[Kind], extra: int) -> list[dict[str, Any]]:
    others = [k for k in KINDS if k not in needed]
    offered = needed + r.sample(others, extra)
    r.shuffle(offered)
    return [k.spec() for k in offered]


def _join(parts: list[str], r: random.Random) -> str:
    if len(parts) == 2 and r.random() < 0.5:
        return parts[0].rstrip(".?!") + " and also " + parts[1][0].lower() + parts[1][1:]
    return " ".join(parts) if r.random() < 0.5 else " Also, ".join(parts)


def row(r: random.Random, shape: str) -> dict[str, Any]:
    """One conversation of ``shape`` (one of :data:`SHAPES`)."""
    kind = r.choice(KINDS)
    extra = r.choice([0, 1, 1, 2, 3])
    if shape == "single":
        text, args = kind.request(r)
        return _row(shape, text, _tools(r, [kind], extra), {"tool_calls": [{"name": kind.name, "arguments": args}]})
    if shape == "parallel":
        n = r.choice([2, 2, 3])
        reqs: list[tuple[str, dict[str, Any]]] = []
        while len(reqs) < n:
            q = kind.request(r)
            if all(q[1] != a for _, a in reqs):
                reqs.append(q)
        calls = [{"name": kind.name, "arguments": a} for _, a in reqs]
        return _row(shape, _join([t for t, _ in reqs], r), _tools(r, [kind], extra), {"tool_calls": calls})
    if shape == "multi":
        k1, k2 = r.sample(KINDS, 2)
        (t1, a1), (t2, a2) = k1.request(r), k2.request(r)
        calls = [{"name": k1.name, "arguments": a1}, {"name": k2.name, "arguments": a2}]
        return _row(shape, _join([t1, t2], r), _tools(r, [k1, k2], min(extra, 2)), {"tool_calls": calls})
    if shape == "irrelevant":
        text = kind.near_miss(r) if r.random() < 0.5 else r.choice(IRRELEVANT)
        return _row(shape, text, _tools(r, [kind], extra), {"content": NO_TOOL_ANSWER})
    text, args = kind.request(r)
    result, answer = kind.result(args, r)
    messages = [
        {"role": "user", "content": text},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": kind.name, "arguments": json.dumps(args)}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": kind.name, "content": result},
    ]
    return {**_row(shape, text, _tools(r, [kind], extra), {"content": answer}), "messages": messages}


def _row(shape: str, text: str, tools: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    return {
        "category": "synthetic_" + shape,
        "messages": [{"role": "user", "content": text}],
        "tools": tools,
        "output": output,
    }


def examples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows, shapes drawn with :data:`WEIGHTS`, reproducible from ``seed``."""
    r = random.Random(seed)
    return [row(r, r.choices(SHAPES, WEIGHTS)[0]) for _ in range(n)]


if __name__ == "__main__":
    for ex in examples(int(sys.argv[1]) if len(sys.argv) > 1 else 5, seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0):
        print(json.dumps(ex, ensure_ascii=False))
