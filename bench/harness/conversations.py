"""Long multi-session conversations in ordinary language, with questions that name the turns holding their answer.

Two sources, one shape (`Conversation`: dated sessions of turns, and `Question`s with a gold answer phrase, the
ids of their evidence turns and a category):

    generated   `generate(seed)`: two friends talking over ~24 sessions, about themselves and the people around
                them; facts are stated in plain sentences among small talk, greetings and fillers. Each fact is
                asked about once: single-hop (one turn), temporal (when: the session's date), updated (a fact
                that changed later: only the later turn answers) and multi-hop (two turns in different sessions).
                Deterministic: the same seed gives the same conversation.
    LoCoMo      `load_locomo(path)`: snap-research/locomo's `data/locomo10.json` (or the per-conversation files of
                its `data/locomo10.zip`), CC BY-NC 4.0: read from where the user put it, never shipped here.

A turn is sent as `Speaker: text`; a session's first turn starts with its date (`[1:56 pm on 8 May, 2023]`), as a
chat client stamping a new day would.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

SINGLE_HOP = "single-hop"
MULTI_HOP = "multi-hop"
TEMPORAL = "temporal"
UPDATED = "updated fact"
OPEN_DOMAIN = "open-domain"
LOCOMO_CATEGORIES = {1: MULTI_HOP, 2: TEMPORAL, 3: OPEN_DOMAIN, 4: SINGLE_HOP}
"""LoCoMo's numbered categories (its task_eval/evaluation.py); 5 (adversarial: no answer in the chat) is left out."""

SESSIONS = 30
TURNS_PER_SESSION = (16, 24)
QUESTIONS_PER_KIND = 8
START = date(2023, 3, 6)


@dataclass(frozen=True)
class Turn:
    id: str
    speaker: str
    text: str


@dataclass(frozen=True)
class Session:
    date_time: str
    """As the conversation shows it: `1:56 pm on 8 May, 2023`."""
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    evidence: tuple[str, ...]
    """Ids of the turns that hold the answer."""
    category: str


@dataclass(frozen=True)
class Conversation:
    name: str
    speakers: tuple[str, str]
    """The first is the chat's user, the second its assistant."""
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]

    def turns(self) -> Iterator[tuple[Session, Turn]]:
        for session in self.sessions:
            for turn in session.turns:
                yield session, turn

    def messages(self) -> list[dict[str, str]]:
        """The chat's messages (no system prompt): a speaker's consecutive turns are one message, so that roles
        alternate; each turn's text stays in it verbatim (`turn_text`)."""
        messages: list[dict[str, str]] = []
        for session in self.sessions:
            for index, turn in enumerate(session.turns):
                role = "user" if turn.speaker == self.speakers[0] else "assistant"
                text = turn_text(turn)
                if index == 0:
                    text = f"[{session.date_time}] {text}"
                if messages and messages[-1]["role"] == role:
                    messages[-1]["content"] += "\n" + text
                else:
                    messages.append({"role": role, "content": text})
        return messages


def turn_text(turn: Turn) -> str:
    return f"{turn.speaker}: {turn.text}"


# --- LoCoMo ---------------------------------------------------------------------------------------------------


def load_locomo(path: Path) -> list[Conversation]:
    """LoCoMo's conversations from `locomo10.json` (a list of samples), one sample's file, or a folder of them."""
    if path.is_dir():
        files = sorted(path.glob("*.json"), key=lambda p: (len(p.stem), p.stem))
        return [_locomo_sample(json.loads(file.read_text()), file.stem) for file in files]
    loaded = json.loads(path.read_text())
    if isinstance(loaded, list):
        return [_locomo_sample(sample, str(sample.get("sample_id", n))) for n, sample in enumerate(loaded)]
    return [_locomo_sample(loaded, path.stem)]


def _locomo_sample(sample: dict[str, Any], name: str) -> Conversation:
    chat = sample.get("conversation", sample)
    numbers = sorted(int(key.split("_")[1]) for key in chat if key.startswith("session_") and key.count("_") == 1)
    sessions = []
    for number in numbers:
        turns = tuple(
            Turn(
                raw["dia_id"],
                raw["speaker"],
                raw["text"] + (f" [shares {raw['blip_caption']}]" if raw.get("blip_caption") else ""),
            )
            for raw in chat[f"session_{number}"]
        )
        if turns:
            sessions.append(Session(chat[f"session_{number}_date_time"], turns))
    questions = tuple(
        Question(qa["question"], str(qa["answer"]), tuple(qa.get("evidence") or ()), LOCOMO_CATEGORIES[qa["category"]])
        for qa in sample.get("qa", ())
        if qa.get("category") in LOCOMO_CATEGORIES and "answer" in qa
    )
    return Conversation(f"locomo-{name}", (chat["speaker_a"], chat["speaker_b"]), tuple(sessions), questions)


# --- generated ------------------------------------------------------------------------------------------------

NAMES = (
    "Maria", "John", "Aisha", "Tom", "Lena", "Marco", "Priya", "Sam", "Elena", "David", "Yuki", "Omar", "Sofia",
    "Lucas", "Grace", "Ivan", "Nora", "Felix", "Chloe", "Daniel", "Amara", "Hugo", "Ines", "Kofi", "Mila", "Ravi",
    "Zoe", "Pablo", "Hanna", "Leo", "Tara", "Noah", "Freya", "Emil", "Ruth", "Oscar", "Clara", "Theo", "Vera", "Ben",
)  # fmt: skip
RELATIVES = ("cousin", "neighbour", "colleague", "best friend", "flatmate", "old classmate", "friend")
PETS = ("Biscuit", "Pepper", "Mochi", "Waffles", "Juniper", "Pickles", "Noodle", "Clover", "Ziggy", "Marmalade")
ANIMALS = ("beagle", "tabby cat", "parrot", "rabbit", "corgi", "tortoise", "greyhound", "hamster")
CITIES = (
    "Porto", "Valencia", "Krakow", "Ghent", "Bologna", "Tallinn", "Lyon", "Galway", "Bergen", "Ljubljana", "Seville",
    "Utrecht", "Salzburg", "Gdansk", "Aarhus", "Nantes",
)  # fmt: skip
MULTI_HOP_CITIES = CITIES[8:]
"""Cities only the multi-hop facts use: a trip to the same city would answer their question by accident."""
PLACES = ("Elm Street", "Riverside", "Harbour Road", "Maple Avenue", "Old Town", "Hillcrest", "Mill Lane", "Parkside")
ACTIVITIES = ("pottery", "salsa", "watercolour", "climbing", "Italian", "sourdough baking", "fencing", "choir")
INSTRUMENTS = ("cello", "trumpet", "ukulele", "flute", "drums", "harp", "banjo", "saxophone")
BOOKS = (
    "The Salt Road", "A Winter Orchard", "Paper Lanterns", "The Quiet Tide", "Copper Hills", "The Ninth Bridge",
    "Stone and Feather", "Harbour Lights",
)  # fmt: skip
AUTHORS = ("Ada Moreno", "Colin Pratt", "Helen Osei", "Rui Tanaka", "Ilse Brandt", "Owen Gale", "Lucia Ferri")
EVENTS = (
    ("ran", "run", "the harbour half marathon"), ("passed", "pass", "my driving test"),
    ("gave", "give", "my first conference talk"), ("finished", "finish", "the charity bike ride"),
    ("opened", "open", "my little bakery stall"), ("sang at", "sing at", "the spring concert"),
    ("adopted", "adopt", "a rescue kitten"), ("hiked", "hike", "up Ben Lomond"), ("got", "get", "my pilot licence"),
    ("planted", "plant", "the community garden"),
)  # fmt: skip
"""(said, asked, what): "I ran the harbour half marathon" / "When did Maria run the harbour half marathon?"."""
JOBS = ("nurse", "librarian", "carpenter", "pharmacist", "teacher", "sound engineer", "baker", "translator")
ORGS = (
    "St. Anne's hospital", "the Riverside library", "Greenleaf Studios", "the Hollow Oak cafe", "Brightwater school",
    "Northgate Pharmacy", "the Lantern theatre", "Fjord Translations", "Kestrel Joinery", "the city archive",
)  # fmt: skip
TOWNS = ("Ashford", "Millbrook", "Oakridge", "Fairhaven", "Stonebridge", "Willowdale", "Redcliff", "Brookfield")

SMALL_TALK = (
    "Work has been pretty hectic lately, but I'm hanging in there.",
    "I've been trying to cook more at home, mostly soups and stews.",
    "The weather finally turned, so we've been going on long walks.",
    "I watched a documentary about octopuses last night and it was fascinating.",
    "Honestly I just needed a quiet weekend to recharge.",
    "The garden is a mess, the slugs ate all my lettuce again.",
    "I've been listening to a lot of old jazz records recently.",
    "We finally fixed the leaky tap in the kitchen, what a relief.",
    "I keep meaning to read more, but the evenings just disappear.",
    "My back has been a bit sore, so I'm doing stretches every morning.",
    "The kids next door have started learning to skateboard, it's loud but sweet.",
    "I tried a new coffee place and it was surprisingly good.",
    "We had friends over for dinner and stayed up far too late talking.",
    "I've been thinking about redecorating the living room.",
    "The train was delayed again this morning, classic.",
    "I'm trying to spend less time on my phone before bed.",
    "It's been raining nonstop, I almost forgot what the sun looks like.",
    "I cleaned out the attic and found all my old school notebooks.",
    "We went to the farmers market and came back with way too many apples.",
    "I've started journaling a little, just a few lines each night.",
    "That new series everyone talks about is actually worth it.",
    "I'm so tired of emails, I swear they multiply overnight.",
    "Life has been busy but good, mostly.",
    "I finally got around to sorting my photos from last summer.",
)  # fmt: skip
REPLIES = (
    "That sounds lovely!", "Oh no, that's annoying.", "Haha, I know exactly what you mean.", "Good for you!",
    "I really need to do that too.", "That's so nice to hear.", "Wow, I didn't expect that.", "Totally agree.",
    "That must have been a lot.", "I love that for you.", "Sounds like a good plan.", "Ha, same here honestly.",
)  # fmt: skip
FILLERS = ("Thanks, {name}.", "Yeah, {name}!", "Haha, totally.", "Right?", "Aw, thanks {name}!", "Same!", "True.")
GREETINGS = (
    "Hey {name}! Good to see you! How have you been?", "Hi {name}! Long time no talk, what's new?",
    "Hey {name}, hope your week is going well!", "Hi {name}! Got a minute to catch up?",
)  # fmt: skip
GREETING_REPLIES = (
    "Hey {name}! Busy as always, but good.",
    "Hi {name}! So good to hear from you.",
    "Hey! All good here.",
)
CLOSINGS = ("Take care, {name}! Talk soon.", "Gotta run, {name}. Bye for now!", "Talk to you later, {name}!")
CLOSING_REPLIES = ("Bye, {name}!", "See you, {name}!", "Take care!")


@dataclass
class _Plan:
    """Where the facts go: session → the speaker's fact sentences, in order; and the questions, by turn key."""

    facts: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    """Session → (speaker, sentence, …) to state in it; each sentence gets a key (`session:n`) to name its turn."""
    questions: list[tuple[str, str, tuple[tuple[int, int], ...], str]] = field(default_factory=list)
    """(question, answer, evidence as (session, index in that session's facts), category)."""

    def state(self, session: int, speaker: str, sentence: str) -> tuple[int, int]:
        said = self.facts.setdefault(session, [])
        said.append((speaker, sentence))
        return session, len(said) - 1


def generate(seed: int, sessions: int = SESSIONS, per_kind: int = QUESTIONS_PER_KIND) -> Conversation:
    """One generated conversation (see the module docstring); the same seed always gives the same one."""
    rng = random.Random(seed)
    people = rng.sample(NAMES, 2 + 4 * per_kind)
    speakers = (people[0], people[1])
    others = iter(people[2:])
    dates = _dates(rng, sessions)
    plan = _Plan()
    _plan_single_hop(rng, plan, speakers, others, sessions, per_kind)
    _plan_temporal(rng, plan, speakers, dates, sessions, per_kind)
    _plan_updates(rng, plan, speakers, sessions, per_kind)
    _plan_multi_hop(rng, plan, speakers, others, sessions, per_kind)
    built, ids = [], {}
    for number in range(sessions):
        turns = _session_turns(rng, speakers, plan.facts.get(number, []))
        numbered = tuple(Turn(f"D{number + 1}:{i + 1}", speaker, text) for i, (speaker, text, _) in enumerate(turns))
        for turn, (_, _, fact) in zip(numbered, turns, strict=True):
            if fact is not None:
                ids[(number, fact)] = turn.id
        built.append(Session(dates[number], numbered))
    questions = tuple(
        Question(text, answer, tuple(ids[key] for key in evidence), category)
        for text, answer, evidence, category in plan.questions
    )
    return Conversation(f"generated-{seed}", speakers, tuple(built), questions)


def _dates(rng: random.Random, sessions: int) -> list[str]:
    day, shown = START, []
    for _ in range(sessions):
        day += timedelta(days=rng.randint(3, 16))
        hour, minute = rng.randint(1, 12), rng.randint(0, 59)
        shown.append(f"{hour}:{minute:02d} {rng.choice(('am', 'pm'))} on {day.day} {day:%B}, {day.year}")
    return shown


def _plan_single_hop(
    rng: random.Random, plan: _Plan, speakers: Sequence[str], others: Iterator[str], n: int, k: int
) -> None:
    kinds = [_pet, _classes, _book, _trip]
    pools = {"pet": rng.sample(PETS, k), "place": rng.sample(PLACES, k), "book": rng.sample(BOOKS, k)}
    pools["city"] = [city for city in CITIES if city not in MULTI_HOP_CITIES][:k]
    rng.shuffle(pools["city"])
    for index in range(k):
        speaker = speakers[index % 2]
        sentence, question, answer = kinds[index % len(kinds)](rng, speaker, next(others), pools, index)
        key = plan.state(rng.randrange(n), speaker, sentence)
        plan.questions.append((question, answer, (key,), SINGLE_HOP))


def _pet(rng: random.Random, speaker: str, other: str, pools: dict[str, list[str]], i: int) -> tuple[str, str, str]:
    relative, animal, pet = rng.choice(RELATIVES), rng.choice(ANIMALS), pools["pet"][i]
    return (
        f"Oh, my {relative} {other} just adopted a {animal}, she named it {pet} and it's adorable.",
        f"What is the name of the {animal} that {speaker}'s {relative} {other} adopted?",
        pet,
    )


def _classes(rng: random.Random, speaker: str, other: str, pools: dict[str, list[str]], i: int) -> tuple[str, str, str]:
    activity, place = rng.choice(ACTIVITIES), pools["place"][i]
    return (
        f"I finally signed up for {activity} classes at the community centre on {place}.",
        f"Where does {speaker} take {activity} classes?",
        place,
    )


def _book(rng: random.Random, speaker: str, other: str, pools: dict[str, list[str]], i: int) -> tuple[str, str, str]:
    book, author = pools["book"][i], rng.choice(AUTHORS)
    return (
        f"{other} lent me {book} by {author}, I can't put it down.",
        f"Which book by {author} did {other} lend to {speaker}?",
        book,
    )


def _trip(rng: random.Random, speaker: str, other: str, pools: dict[str, list[str]], i: int) -> tuple[str, str, str]:
    city = pools["city"][i]
    return (
        f"My {rng.choice(RELATIVES)} {other} and I are planning a trip to {city} in the autumn.",
        f"Which city are {speaker} and {other} planning to visit?",
        city,
    )


def _plan_temporal(
    rng: random.Random, plan: _Plan, speakers: Sequence[str], dates: Sequence[str], n: int, k: int
) -> None:
    for index, (said, asked, thing) in enumerate(rng.sample(EVENTS, k)):
        speaker, session = speakers[index % 2], rng.randrange(n)
        key = plan.state(session, speaker, f"Guess what, I {said} {thing} this morning!")
        answer = dates[session].split(" on ", 1)[1]
        question = f"On which day did {speaker} {asked} {thing.replace('my ', 'their ')}?"
        plan.questions.append((question, answer, (key,), TEMPORAL))


def _plan_updates(rng: random.Random, plan: _Plan, speakers: Sequence[str], n: int, k: int) -> None:
    jobs, orgs, towns = rng.sample(JOBS, len(JOBS)), rng.sample(ORGS, len(ORGS)), rng.sample(TOWNS, len(TOWNS))
    for index in range(k):
        speaker = speakers[index % 2]
        first = rng.randrange(n // 2)
        later = rng.randrange(first + 2, n)
        if index % 2 == 0 and len(orgs) >= 2:
            old, new, job = orgs.pop(), orgs.pop(), jobs[index % len(jobs)]
            plan.state(first, speaker, f"I work as a {job} at {old}, it's a good team.")
            key = plan.state(later, speaker, f"Big news: I left {old}, I'm now working at {new}.")
            plan.questions.append((f"Where does {speaker} work now?", new, (key,), UPDATED))
        else:
            old, new = towns.pop(), towns.pop()
            plan.state(first, speaker, f"We've lived in {old} for years now, I love the quiet.")
            key = plan.state(later, speaker, f"We finally moved, we live in {new} now, boxes everywhere.")
            plan.questions.append((f"Which town does {speaker} live in now?", new, (key,), UPDATED))


def _plan_multi_hop(
    rng: random.Random, plan: _Plan, speakers: Sequence[str], others: Iterator[str], n: int, k: int
) -> None:
    cities, instruments = list(MULTI_HOP_CITIES), rng.sample(INSTRUMENTS, len(INSTRUMENTS))
    rng.shuffle(cities)
    for index in range(k):
        speaker, first = speakers[index % 2], rng.randrange(n - 2)
        later = rng.randrange(first + 1, n)
        person, partner = next(others), next(others)
        relative = rng.choice(RELATIVES)
        if index % 2 == 0:
            city = cities.pop()
            a = plan.state(first, speaker, f"My {relative} {person} moved to {city} for a new job last month.")
            b = plan.state(later, speaker, f"{person} got engaged to {partner}, we're all thrilled!")
            question = f"In which city does the person who got engaged to {partner} live?"
            plan.questions.append((question, city, (a, b), MULTI_HOP))
        else:
            instrument = instruments.pop()
            a = plan.state(first, speaker, f"My {relative} {person} teaches {instrument} at the music school.")
            b = plan.state(later, speaker, f"{partner} started weekly lessons with {person}, she's so excited.")
            question = f"Which instrument is {partner} learning?"
            plan.questions.append((question, instrument, (a, b), MULTI_HOP))


def _session_turns(
    rng: random.Random, speakers: Sequence[str], facts: Sequence[tuple[str, str]]
) -> list[tuple[str, str, int | None]]:
    """(speaker, text, index of the fact it states or None): greetings, small talk with the facts spread through
    it (each in its speaker's turn), fillers, and a goodbye; speakers alternate."""
    a, b = speakers
    length = rng.randint(*TURNS_PER_SESSION)
    turns: list[tuple[str, str, int | None]] = [
        (a, rng.choice(GREETINGS).format(name=b), None),
        (b, rng.choice(GREETING_REPLIES).format(name=a), None),
    ]
    pending = list(enumerate(facts))
    while len(turns) < length - 2 or pending:
        speaker = speakers[len(turns) % 2]
        listener = speakers[(len(turns) + 1) % 2]
        due = next((p for p in pending if p[1][0] == speaker), None)
        if due is not None and rng.random() < 0.5 + 0.5 * (len(turns) >= length - 4):
            pending.remove(due)
            index, (_, sentence) = due
            text = f"{sentence} {rng.choice(SMALL_TALK)}" if rng.random() < 0.5 else sentence
            turns.append((speaker, text, index))
        elif rng.random() < 0.25:
            turns.append((speaker, rng.choice(FILLERS).format(name=listener), None))
        else:
            talk = " ".join(rng.sample(SMALL_TALK, rng.randint(1, 3)))
            turns.append((speaker, f"{rng.choice(REPLIES)} {talk}" if rng.random() < 0.5 else talk, None))
    turns.append((speakers[len(turns) % 2], rng.choice(CLOSINGS).format(name=speakers[(len(turns) + 1) % 2]), None))
    turns.append(
        (speakers[len(turns) % 2], rng.choice(CLOSING_REPLIES).format(name=speakers[(len(turns) + 1) % 2]), None)
    )
    return turns
