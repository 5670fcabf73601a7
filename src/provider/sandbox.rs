pub struct SandboxProvider;
