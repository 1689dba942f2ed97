"""Built-in environments: one module per task. Registration only names entry points, so
importing this package stays cheap; a module is imported on the first ``make`` of its id."""
from ..registry import register

# Debate (MAPoRL protocol): N agents answer, then see the others' answers and answer again.
register("gsm8k_debate-v0", "llm_marl_envs.envs.gsm8k_debate:GSM8KDebateEnv")
register("anli_debate-v0", "llm_marl_envs.envs.anli_debate:ANLIDebateEnvV0")    # deprecated: v1's data differ
register("anli_debate-v1", "llm_marl_envs.envs.anli_debate:ANLIDebateEnv")
register("gsm_symbolic_debate-v0", "llm_marl_envs.envs.gsm_symbolic_debate:GSMSymbolicDebateEnv")
register("arithmetic_debate-v0", "llm_marl_envs.envs.arithmetic_debate:ArithmeticDebateEnv")

# Writing collaboration (MAGRPO protocol): 2 agents write complementary parts, one joint reward.
register("tldr_writing-v0", "llm_marl_envs.envs.tldr_writing:TLDRWritingEnv")
register("arxiv_writing-v0", "llm_marl_envs.envs.arxiv_writing:ArxivWritingEnv")

# Coding collaboration (MAGRPO protocol): helper writers + an entry-point writer, one joint reward.
register("humaneval_coding-v0", "llm_marl_envs.envs.humaneval_coding:HumanEvalCodingEnv")
register("mbpp_coding-v0", "llm_marl_envs.envs.mbpp_coding:MBPPCodingEnv")
register("coophumaneval_coding-v0", "llm_marl_envs.envs.coophumaneval_coding:CoopHumanEvalCodingEnv")
