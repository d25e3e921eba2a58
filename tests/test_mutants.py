"""The mutants of ``make mutants`` stay applicable: a source change that moves a mutant's text
makes that mutant "not caught" only when the slow mutant run happens; this fails at once."""

from __future__ import annotations

from tests.mutants import all_mutants, stale_mutants


def test_every_mutant_text_occurs_once_in_its_source_and_the_mutated_source_parses() -> None:
    assert len(all_mutants()) > 100  # the mutant modules were found
    assert stale_mutants() == {}
