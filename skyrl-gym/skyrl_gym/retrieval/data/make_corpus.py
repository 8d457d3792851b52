r"""Generate the bundled corpus: a small encyclopedia of an invented world, and questions answerable from it.

Every name and fact is made up, so a model cannot answer from memory and has to search. Facts link across
articles (a scientist's article names the city they were born in; that city's article names its country), which
gives multi-hop questions. Generation is deterministic: the same seed always writes byte-identical files, and
``tests/retrieval/test_bundled_data.py`` checks that the shipped files equal a fresh run.

Regenerate the shipped files with::

    python -m skyrl_gym.retrieval.data.make_corpus            # writes next to this file
    python -m skyrl_gym.retrieval.data.make_corpus --out DIR

Files:

``corpus.jsonl``
    Search-R1 corpus rows ``{"id": "<n>", "contents": "\"<Title>\"\n<text>"}``.
``questions.jsonl``
    ``{"id", "question", "golden_answers": [str, ...], "hops": 1 | 2, "supporting_ids": [corpus id, ...]}``;
    any of ``golden_answers`` is correct under exact match after normalisation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

__all__ = ["CORPUS_FILENAME", "QUESTIONS_FILENAME", "SEED", "Question", "World", "generate", "main", "write"]

SEED: Final = 20240611
CORPUS_FILENAME: Final = "corpus.jsonl"
QUESTIONS_FILENAME: Final = "questions.jsonl"

# --- names -------------------------------------------------------------------------------------------------------

_ONSETS = "b br d dr f g gr h k kr l m n p r s st t tr v vr z th sh".split()  # noqa: SIM905
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ai", "ou", "ei"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rn", "sk"]


class _Names:
    """Invents pronounceable names, none used twice (compared case-insensitively)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def word(self, syllables: int, suffix: str = "") -> str:
        while True:
            parts = [self._rng.choice(_ONSETS) + self._rng.choice(_VOWELS) for _ in range(syllables)]
            parts[-1] += self._rng.choice(_CODAS)
            name = ("".join(parts) + suffix).capitalize()
            if name.lower() not in self._used and 4 <= len(name) <= 13:
                self._used.add(name.lower())
                return name


# --- the world ---------------------------------------------------------------------------------------------------

_FIELDS = {
    "astronomy": "astronomer",
    "botany": "botanist",
    "cartography": "cartographer",
    "chemistry": "chemist",
    "geology": "geologist",
    "linguistics": "linguist",
    "mathematics": "mathematician",
    "medicine": "physician",
    "metallurgy": "metallurgist",
    "navigation": "navigator",
    "physics": "physicist",
}
_DEVICES = "lamp loom engine press compass telescope clock pump kiln valve lens battery sextant barometer".split()  # noqa: SIM905
_CURRENCY_UNITS = ["crown", "mark", "florin", "thaler", "shilling"]
_SCHOOL_KINDS = ["College", "Academy", "Institute", "University"]


@dataclasses.dataclass
class Person:
    """A scholar: ``founded`` is set for university founders, ``advisor``/``school`` for everyone else."""

    first: str
    last: str
    born: int
    died: int
    birth_city: City
    field: str
    school: University | None = None
    advisor: Person | None = None
    founded: University | None = None

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclasses.dataclass
class Country:
    name: str
    region: str
    founded: int
    currency: str
    language: str = ""
    cities: list[City] = dataclasses.field(default_factory=list)
    mountain: Mountain | None = None

    @property
    def capital(self) -> City:
        return self.cities[0]


@dataclasses.dataclass
class City:
    name: str
    country: Country
    founded: int
    population: int
    river: River | None = None


@dataclasses.dataclass
class Mountain:
    name: str
    country: Country
    height_m: int
    climber: Person | None = None
    climbed: int = 0


@dataclasses.dataclass
class River:
    name: str
    length_km: int
    sea: str
    source: Mountain | None
    cities: list[City]

    @property
    def countries(self) -> list[Country]:
        seen: list[Country] = []
        for city in self.cities:
            if city.country not in seen:
                seen.append(city.country)
        return seen


@dataclasses.dataclass
class University:
    name: str
    city: City
    founded: int
    founder: Person | None = None


@dataclasses.dataclass
class Invention:
    name: str
    inventor: Person
    year: int
    city: City


@dataclasses.dataclass
class World:
    """Everything generated, with cross references between the entities."""

    regions: list[str]
    seas: list[str]
    languages: list[str]
    countries: list[Country]
    mountains: list[Mountain]
    rivers: list[River]
    universities: list[University]
    people: list[Person]
    inventions: list[Invention]

    @property
    def cities(self) -> list[City]:
        """Every city, country by country (capital first)."""
        return [city for country in self.countries for city in country.cities]


def _build_world(rng: random.Random) -> World:
    names = _Names(rng)
    regions = [names.word(2) for _ in range(5)]
    seas = [f"{names.word(2)} Sea" for _ in range(8)]
    languages = [names.word(2, "ic") for _ in range(18)]
    countries = _make_countries(rng, names, regions, languages)
    mountains = _make_mountains(rng, names, countries)
    rivers = _make_rivers(rng, names, countries, mountains, seas)
    world_cities = [city for country in countries for city in country.cities]
    universities, founders = _make_universities(rng, names, world_cities)
    scholars = _make_scholars(rng, names, world_cities, universities)
    people = founders + scholars
    _assign_climbers(rng, mountains, scholars)
    inventions = _make_inventions(rng, names, scholars)
    return World(regions, seas, languages, countries, mountains, rivers, universities, people, inventions)


def _make_countries(rng: random.Random, names: _Names, regions: list[str], languages: list[str]) -> list[Country]:
    countries = []
    for index in range(36):
        suffix = rng.choice(["ia", "ar", "esh", "onia", "and", "ira"])
        country = Country(
            name=names.word(2, suffix),
            region=regions[index % len(regions)],
            founded=rng.randint(900, 1600),
            currency=f"{names.word(2)} {rng.choice(_CURRENCY_UNITS)}",
            language=languages[index % len(languages)],
        )
        for _ in range(3):
            suffix = rng.choice(["", "", "holm", "grad", "port", "ford", "by"])
            founded = rng.randint(country.founded - 300, country.founded + 300)
            country.cities.append(City(names.word(2, suffix), country, founded, rng.randint(8, 900) * 1000))
        countries.append(country)
    return countries


def _make_mountains(rng: random.Random, names: _Names, countries: list[Country]) -> list[Mountain]:
    mountains = []
    for country in rng.sample(countries, 30):
        mountain = Mountain(f"Mount {names.word(2)}", country, rng.randint(1800, 7400))
        country.mountain = mountain
        mountains.append(mountain)
    return mountains


def _make_rivers(
    rng: random.Random, names: _Names, countries: list[Country], mountains: list[Mountain], seas: list[str]
) -> list[River]:
    # Each river visits cities of up to three neighbouring countries (neighbours by list position).
    free = [city for country in countries for city in country.cities]
    rivers = []
    for index in range(30):
        start = (index * 6 + rng.randint(0, 5)) % len(countries)
        nearby = [c for k in range(rng.randint(1, 3)) for c in countries[(start + k) % len(countries)].cities]
        on_river = [city for city in nearby if city in free and rng.random() < 0.5][:3]
        if not on_river:
            continue
        sources = [m for m in mountains if m.country is on_river[0].country]
        source = sources[0] if sources else None
        river = River(f"{names.word(2)} River", rng.randint(80, 2900), rng.choice(seas), source, on_river)
        for city in on_river:
            city.river = river
            free.remove(city)
        rivers.append(river)
    return rivers


def _make_person(rng: random.Random, names: _Names, born: int, birth_city: City) -> Person:
    return Person(
        first=names.word(2),
        last=names.word(rng.choice([2, 3])),
        born=born,
        died=born + rng.randint(45, 90),
        birth_city=birth_city,
        field=rng.choice(sorted(_FIELDS)),
    )


def _make_universities(rng: random.Random, names: _Names, cities: list[City]) -> tuple[list[University], list[Person]]:
    universities, founders = [], []
    for city in rng.sample(cities, 36):
        founder = _make_person(rng, names, rng.randint(1450, 1660), rng.choice(cities))
        name = f"{names.word(2)} {rng.choice(_SCHOOL_KINDS)}"
        university = University(name, city, founder.born + rng.randint(30, 44))
        university.founder, founder.founded = founder, university
        universities.append(university)
        founders.append(founder)
    return universities, founders


def _make_scholars(
    rng: random.Random, names: _Names, cities: list[City], universities: list[University]
) -> list[Person]:
    scholars: list[Person] = []
    for _ in range(124):
        born = rng.randint(1700, 1890)
        scholar = _make_person(rng, names, born, rng.choice(cities))
        scholar.school = rng.choice([u for u in universities if u.founded < born])
        elders = [p for p in scholars if 20 <= born - p.born <= 45]
        if elders and rng.random() < 0.7:
            scholar.advisor = rng.choice(elders)
        scholars.append(scholar)
    return scholars


def _assign_climbers(rng: random.Random, mountains: list[Mountain], scholars: list[Person]) -> None:
    for mountain, climber in zip(mountains, rng.sample(scholars, len(mountains)), strict=True):
        mountain.climber = climber
        mountain.climbed = climber.born + rng.randint(20, 40)


def _make_inventions(rng: random.Random, names: _Names, scholars: list[Person]) -> list[Invention]:
    inventions = []
    for inventor in rng.sample(scholars, 100):
        school = inventor.school
        city = school.city if school is not None and rng.random() < 0.5 else inventor.birth_city
        name = f"{names.word(2)} {rng.choice(_DEVICES)}"
        inventions.append(Invention(name, inventor, inventor.born + rng.randint(25, 55), city))
    return inventions


# --- articles ----------------------------------------------------------------------------------------------------


def _join(items: Sequence[str]) -> str:
    """Join as prose: ``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _country_article(world: World, country: Country) -> str:
    others = [city.name for city in country.cities[1:]]
    text = [
        f"{country.name} is a country in {country.region}, founded in {country.founded}.",
        f"The capital of {country.name} is {country.capital.name}; its other cities include {_join(others)}.",
        f"The official language of {country.name} is {country.language}, and its currency is the {country.currency}.",
    ]
    if country.mountain is not None:
        text.append(f"The highest mountain in {country.name} is {country.mountain.name}.")
    rivers = [r.name for r in world.rivers if country in r.countries]
    if rivers:
        text.append(f"Rivers of {country.name} include the {_join(rivers)}.")
    return " ".join(text)


def _city_article(world: World, city: City) -> str:
    role = f"the capital of {city.country.name}" if city is city.country.capital else f"a city in {city.country.name}"
    text = [f"{city.name} is {role}. It was founded in {city.founded} and has about {city.population} inhabitants."]
    if city.river is not None:
        text.append(f"The {city.river.name} flows through {city.name}.")
    schools = [u.name for u in world.universities if u.city is city]
    if schools:
        text.append(f"{_join(schools)} is located in {city.name}.")
    natives = [p.name for p in world.people if p.birth_city is city][:3]
    if natives:
        text.append(f"People born in {city.name} include {_join(natives)}.")
    return " ".join(text)


def _person_article(world: World, person: Person) -> str:
    origin = f"{person.birth_city.name}, {person.birth_city.country.name}"
    text = [f"{person.name} ({person.born}-{person.died}) was a {_FIELDS[person.field]} born in {origin}."]
    if person.founded is not None:
        u = person.founded
        text.append(f"In {u.founded} {person.last} founded {u.name} in {u.city.name}.")
    if person.school is not None:
        text.append(f"{person.last} studied {person.field} at {person.school.name}.")
    if person.advisor is not None:
        text.append(f"{person.last}'s doctoral advisor was {person.advisor.name}.")
    for invention in world.inventions:
        if invention.inventor is person:
            text.append(f"{person.last} is best known for inventing the {invention.name} in {invention.year}.")
    for mountain in world.mountains:
        if mountain.climber is person:
            text.append(f"In {mountain.climbed} {person.last} made the first recorded ascent of {mountain.name}.")
    return " ".join(text)


def _mountain_article(world: World, mountain: Mountain) -> str:
    text = [
        f"{mountain.name} is a mountain in {mountain.country.name}.",
        f"At {mountain.height_m} metres it is the highest peak of {mountain.country.name}.",
    ]
    if mountain.climber is not None:
        text.append(f"Its first recorded ascent was made by {mountain.climber.name} in {mountain.climbed}.")
    sources = [r.name for r in world.rivers if r.source is mountain]
    if sources:
        text.append(f"The {_join(sources)} rises on its slopes.")
    return " ".join(text)


def _river_article(world: World, river: River) -> str:
    countries = _join([c.name for c in river.countries])
    source = f"rises on {river.source.name}" if river.source else f"rises in the hills of {river.countries[0].name}"
    return (
        f"The {river.name} is a river in {countries}. It is {river.length_km} kilometres long. "
        f"It {source} and flows into the {river.sea}. "
        f"Cities on the {river.name} include {_join([c.name for c in river.cities])}."
    )


def _university_article(world: World, university: University) -> str:
    founder = university.founder.name if university.founder else "unknown scholars"
    text = [
        f"{university.name} is a university in {university.city.name}, {university.city.country.name}.",
        f"It was founded in {university.founded} by {founder}.",
    ]
    alumni = [p.name for p in world.people if p.school is university][:3]
    if alumni:
        text.append(f"Its alumni include {_join(alumni)}.")
    return " ".join(text)


def _invention_article(world: World, invention: Invention) -> str:
    kind = invention.name.split()[-1]
    return (
        f"The {invention.name} is a {kind} invented by {invention.inventor.name} in {invention.city.name} "
        f"in {invention.year}. It was first described in a treatise on {invention.inventor.field}."
    )


def _region_article(world: World, region: str) -> str:
    members = [c.name for c in world.countries if c.region == region]
    return f"{region} is a continent. Countries in {region} include {_join(members)}."


def _sea_article(world: World, sea: str) -> str:
    rivers = [r.name for r in world.rivers if r.sea == sea]
    inflow = f" Rivers flowing into the {sea} include the {_join(rivers)}." if rivers else ""
    return f"The {sea} is a sea of the known world.{inflow}"


def _language_article(world: World, language: str) -> str:
    official = [c.name for c in world.countries if c.language == language]
    return f"{language} is a language. It is the official language of {_join(official)}."


_T = TypeVar("_T")


def _section(
    entities: Sequence[_T], title: Callable[[_T], str], article: Callable[[World, _T], str], world: World
) -> list[tuple[str, str]]:
    return [(title(entity), article(world, entity)) for entity in entities]


def _articles(world: World) -> list[tuple[str, str]]:
    """(title, text) of every article, in corpus order. Titles are unique: every invented name is."""
    return [
        *_section(world.regions, str, _region_article, world),
        *_section(world.seas, str, _sea_article, world),
        *_section(world.languages, str, _language_article, world),
        *_section(world.countries, lambda c: c.name, _country_article, world),
        *_section(world.cities, lambda c: c.name, _city_article, world),
        *_section(world.mountains, lambda m: m.name, _mountain_article, world),
        *_section(world.rivers, lambda r: r.name, _river_article, world),
        *_section(world.universities, lambda u: u.name, _university_article, world),
        *_section(world.people, lambda p: p.name, _person_article, world),
        *_section(world.inventions, lambda i: i.name, _invention_article, world),
    ]


# --- questions ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Question:
    """A question, its acceptable answers and the titles of the articles that together answer it."""

    question: str
    golden_answers: tuple[str, ...]
    supporting: tuple[str, ...]

    @property
    def hops(self) -> int:
        """How many articles the answer needs."""
        return len(self.supporting)


def _measure(value: int, unit: str, short: str) -> tuple[str, ...]:
    return (str(value), f"{value} {unit}", f"{value} {short}")


def _single_hop_questions(world: World) -> dict[str, list[Question]]:
    """One article answers each question."""
    q = Question
    return {
        "capital": [q(f"What is the capital of {c.name}?", (c.capital.name,), (c.name,)) for c in world.countries],
        "currency": [
            q(f"What is the currency of {c.name}?", (c.currency, c.currency.split()[0]), (c.name,))
            for c in world.countries
        ],
        "city_founded": [q(f"In what year was {c.name} founded?", (str(c.founded),), (c.name,)) for c in world.cities],
        "inventor": [q(f"Who invented the {i.name}?", (i.inventor.name,), (i.name,)) for i in world.inventions],
        "invention_year": [
            q(f"In which year was the {i.name} invented?", (str(i.year),), (i.name,)) for i in world.inventions
        ],
        "birthplace": [q(f"In which city was {p.name} born?", (p.birth_city.name,), (p.name,)) for p in world.people],
        "field": [
            q(f"In which field did {p.name} work?", (p.field, _FIELDS[p.field]), (p.name,)) for p in world.people
        ],
        "height": [
            q(f"How high is {m.name} in metres?", _measure(m.height_m, "metres", "m"), (m.name,))
            for m in world.mountains
        ],
        "length": [
            q(f"How long is the {r.name} in kilometres?", _measure(r.length_km, "kilometres", "km"), (r.name,))
            for r in world.rivers
        ],
        "mouth": [
            q(f"Into which sea does the {r.name} flow?", (r.sea, r.sea.removesuffix(" Sea")), (r.name,))
            for r in world.rivers
        ],
        "founder": [q(f"Who founded {u.name}?", (u.founder.name,), (u.name,)) for u in world.universities if u.founder],
        "university_city": [
            q(f"In which city is {u.name} located?", (u.city.name,), (u.name,)) for u in world.universities
        ],
        "ascent": [
            q(f"Who made the first recorded ascent of {m.name}?", (m.climber.name,), (m.name,))
            for m in world.mountains
            if m.climber
        ],
    }


@dataclasses.dataclass(frozen=True)
class _Template(Generic[_T]):
    """One kind of question: the entities it asks about, and its question about one of them.

    ``ask`` returns None for an entity that lacks a fact the question needs (a city without a river).
    """

    entities: Callable[[World], Sequence[_T]]
    ask: Callable[[_T], Question | None]

    def questions(self, world: World) -> list[Question]:
        """The questions about the world's entities of this kind, in the world's order."""
        return [question for entity in self.entities(world) if (question := self.ask(entity)) is not None]


# Two articles answer each question: the first names the entity the second is about.
_MULTI_HOP: Final[dict[str, _Template[Any]]] = {
    "inventor_country": _Template[Invention](
        lambda w: w.inventions,
        lambda i: Question(
            f"In which country was the inventor of the {i.name} born?",
            (i.inventor.birth_city.country.name,),
            (i.name, i.inventor.name),
        ),
    ),
    "birth_country_capital": _Template[Person](
        lambda w: w.people,
        lambda p: Question(
            f"What is the capital of the country where {p.name} was born?",
            (p.birth_city.country.capital.name,),
            (p.name, p.birth_city.country.name),
        ),
    ),
    "invention_river": _Template[Invention](
        lambda w: w.inventions,
        lambda i: Question(
            f"Which river flows through the city where the {i.name} was invented?",
            (i.city.river.name, i.city.river.name.removesuffix(" River")),
            (i.name, i.city.name),
        )
        if i.city.river
        else None,
    ),
    "school_founder": _Template[Person](
        lambda w: w.people,
        lambda p: Question(
            f"Who founded the university where {p.name} studied?",
            (p.school.founder.name,),
            (p.name, p.school.name),
        )
        if p.school and p.school.founder
        else None,
    ),
    "advisor_born": _Template[Person](
        lambda w: w.people,
        lambda p: Question(
            f"In what year was the doctoral advisor of {p.name} born?",
            (str(p.advisor.born),),
            (p.name, p.advisor.name),
        )
        if p.advisor
        else None,
    ),
    "city_sea": _Template[City](
        lambda w: w.cities,
        lambda c: Question(
            f"Into which sea does the river that flows through {c.name} empty?",
            (c.river.sea, c.river.sea.removesuffix(" Sea")),
            (c.name, c.river.name),
        )
        if c.river
        else None,
    ),
    "capital_language": _Template[Country](
        lambda w: w.countries,
        lambda c: Question(
            f"What is the official language of the country whose capital is {c.capital.name}?",
            (c.language,),
            (c.capital.name, c.name),
        ),
    ),
    "highest_ascent": _Template[Country](
        lambda w: w.countries,
        lambda c: Question(
            f"Who made the first recorded ascent of the highest mountain in {c.name}?",
            (c.mountain.climber.name,),
            (c.name, c.mountain.name),
        )
        if c.mountain and c.mountain.climber
        else None,
    ),
    "founder_birthplace": _Template[University](
        lambda w: w.universities,
        lambda u: Question(
            f"In which city was the founder of {u.name} born?",
            (u.founder.birth_city.name,),
            (u.name, u.founder.name),
        )
        if u.founder
        else None,
    ),
}


def _multi_hop_questions(world: World) -> dict[str, list[Question]]:
    """Two articles answer each question: the first names the entity the second is about (see ``_MULTI_HOP``)."""
    return {name: template.questions(world) for name, template in _MULTI_HOP.items()}


def _pick_questions(rng: random.Random, world: World) -> list[Question]:
    """5 questions per template (fewer where a template has fewer candidates), in template order."""
    picked: list[Question] = []
    for pool, count in ((_single_hop_questions(world), 5), (_multi_hop_questions(world), 5)):
        for candidates in pool.values():
            picked.extend(rng.sample(candidates, min(count, len(candidates))))
    return picked


# --- output ------------------------------------------------------------------------------------------------------


def generate(seed: int = SEED) -> tuple[list[dict[str, str]], list[dict[str, object]]]:
    """Build the world for ``seed`` and return ``(corpus_rows, question_rows)`` as written to the JSON-lines files."""
    rng = random.Random(seed)
    world = _build_world(rng)
    articles = _articles(world)
    doc_ids = {title: str(row) for row, (title, _) in enumerate(articles)}
    corpus = [{"id": doc_ids[title], "contents": f'"{title}"\n{text}'} for title, text in articles]
    questions: list[dict[str, object]] = [
        {
            "id": f"q{number:03d}",
            "question": question.question,
            "golden_answers": list(question.golden_answers),
            "hops": question.hops,
            "supporting_ids": [doc_ids[title] for title in question.supporting],
        }
        for number, question in enumerate(_pick_questions(rng, world))
    ]
    return corpus, questions


def _jsonl(rows: Sequence[dict[str, object]] | Sequence[dict[str, str]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=True) + "\n" for row in rows)


def write(out_dir: str | Path, seed: int = SEED) -> tuple[Path, Path]:
    """Write ``corpus.jsonl`` and ``questions.jsonl`` into ``out_dir`` (created if needed).

    Returns:
        The two paths, corpus first.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus, questions = generate(seed)
    corpus_path, questions_path = out / CORPUS_FILENAME, out / QUESTIONS_FILENAME
    corpus_path.write_text(_jsonl(corpus), encoding="utf-8", newline="\n")
    questions_path.write_text(_jsonl(questions), encoding="utf-8", newline="\n")
    return corpus_path, questions_path


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: regenerate the bundled files (into this package's directory unless ``--out`` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent, help="output directory")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed (the shipped files use the default)")
    args = parser.parse_args(argv)
    corpus_path, questions_path = write(args.out, args.seed)
    print(f"wrote {corpus_path} and {questions_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
